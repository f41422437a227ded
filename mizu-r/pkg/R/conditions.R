# Sentinels (returned, never raised) and classed conditions.

.sentinel <- function(name, text) {
  structure(list(text = text), class = c(name, "mizu_sentinel"))
}

#' Sentinels returned by waits and channel operations
#'
#' Values, not errors: a wait that ran out of time returns `mizu_timeout`; a channel send
#' that found the ring full returns `mizu_full`; a receive on a channel whose peer closed it
#' (after everything sent was read) returns `mizu_closed`, and one whose peer process died
#' returns `mizu_peer_gone`. Test for them with [mizu_is_sentinel()] or `identical()`.
#'
#' @examples
#' mizu_is_sentinel(mizu_timeout)
#' mizu_is_sentinel(42)
#' @name mizu_sentinels
NULL

#' @rdname mizu_sentinels
#' @export
mizu_timeout <- .sentinel("mizu_timeout", "timed out")
#' @rdname mizu_sentinels
#' @export
mizu_full <- .sentinel("mizu_full", "the channel is full")
#' @rdname mizu_sentinels
#' @export
mizu_closed <- .sentinel("mizu_closed", "the channel is closed")
#' @rdname mizu_sentinels
#' @export
mizu_peer_gone <- .sentinel("mizu_peer_gone", "the peer process is gone")

#' Is this a mizu sentinel?
#'
#' @param x Any value.
#' @param which Optionally, a sentinel to compare with (e.g. `mizu_timeout`).
#' @return `TRUE` when `x` is a sentinel (`mizu_timeout`, `mizu_full`, `mizu_closed`,
#'   `mizu_peer_gone`), or the sentinel `which`.
#' @examples
#' mizu_is_sentinel(mizu_closed)
#' mizu_is_sentinel(mizu_closed, mizu_timeout)
#' @export
mizu_is_sentinel <- function(x, which = NULL) {
  if (!inherits(x, "mizu_sentinel")) return(FALSE)
  is.null(which) || identical(class(x)[[1]], class(which)[[1]])
}

#' @export
print.mizu_sentinel <- function(x, ...) {
  cat("<", class(x)[[1]], ": ", x$text, ">\n", sep = "")
  invisible(x)
}

# A condition of `class` (inheriting mizu_error, error, condition) with extra fields.
.mizu_condition <- function(class, message, ...) {
  structure(
    class = unique(c(class, "mizu_error", "error", "condition")),
    list(message = message, call = NULL, ...)
  )
}

.stop <- function(class, message, ...) stop(.mizu_condition(class, message, ...))

# A failure reported by native code as c(class, message); class "interrupt": Ctrl-C arrived
# while it waited.
.raise_failure <- function(f) {
  if (identical(f[[1]], "interrupt")) .signal_interrupt()
  .stop(f[[1]], f[[2]])
}

# Ctrl-C arrived while native code waited: signal an interrupt as R itself does.
.signal_interrupt <- function() {
  cond <- structure(class = c("interrupt", "condition"), list())
  signalCondition(cond)
  invokeRestart("abort")
}
