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
