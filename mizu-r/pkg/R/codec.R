# Payloads are encoded and decoded by native code (src/codec.rs in mizu-r): R's serialization
# with every atomic vector of 4 KiB or more carried out of band and received as a view.

#' Is this vector a view of shared memory?
#'
#' Vectors received from another process (task results, map results, channel messages) of at
#' least 4 KiB arrive as ALTREP views of the shared pages they were written to. Reading them
#' copies nothing; modifying one gives a private copy first, so other processes never see
#' the change.
#'
#' @param x A vector.
#' @return `mizu_is_view()`: whether `x` is a mizu view; `mizu_is_shared()`: whether it still
#'   reads the shared pages (it has not been modified).
#' @examples
#' mizu_is_view(1:10)
#' @export
mizu_is_view <- function(x) .Call(wrap__view_is_view, x)

#' @rdname mizu_is_view
#' @export
mizu_is_shared <- function(x) .Call(wrap__view_is_shared, x)

#' Share a value: copy it into shared memory once
#'
#' A vector, matrix or data frame read by many tasks should be copied once, not once per
#' task. `mizu_share(x)` copies every vector of 4 KiB or more in `x` (numeric, integer,
#' logical, raw, complex, character; data frame columns; list elements) into shared memory
#' and returns the same value over views of it. Sending the result — as a task argument, in
#' a map, as a result, through a channel, to R or Python workers — passes a reference to the
#' same pages, whatever the size. R's copy-on-modify holds: modifying a shared value gives
#' a private copy, never changing what others see. The memory is freed when the last holder
#' in any process lets go of it (a killed worker's references are given back by its pool).
#'
#' @param x A value.
#' @return `x`, its large vectors as views of shared memory (`mizu_is_shared()` is `TRUE`
#'   for them).
#' @examples
#' x <- mizu_share(runif(1e6))
#' mizu_is_shared(x)
#' @export
mizu_share <- function(x) .Call(wrap__share_value, x)
