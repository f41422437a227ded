# Channels: a duplex pair of shared-memory rings between this session and one peer process.

#' Start a peer process connected by a channel
#'
#' Launches a fresh `Rscript` that evaluates `expr` with `channel` bound to its end of the
#' channel (and the named values in `...`); the returned channel is this session's end.
#' Messages are R values (vectors and data frames of 4 KiB or more arrive as views of shared
#' memory). When `expr` finishes, the peer closes its end and exits.
#'
#' @param .expr An expression, evaluated in the peer process (the dot keeps it apart from
#'   the bindings in `...`).
#' @param ... Named values the expression sees.
#' @param .capacity Messages each direction can hold before [mizu_send()] returns
#'   `mizu_full` (rounded up to a power of two; `NULL`: 1024).
#' @param .timeout Seconds to wait for the peer to start.
#' @param language `"r"`, or `"python"`: then `expr` is a string of Python source code, run
#'   by `python -m pymizu._peer` (the interpreter in `MIZU_PYTHON` or `python3`) with
#'   `channel` bound to its end (a `pymizu.Channel`); values cross as `docs/interop.md` says.
#' @return A `mizu_channel`.
#' @examples
#' \donttest{
#' ch <- mizu_channel({
#'   repeat {
#'     x <- mizu_recv(channel)
#'     if (mizu_is_sentinel(x)) break
#'     mizu_send(channel, x * 2)
#'   }
#' })
#' mizu_send(ch, 21)
#' mizu_recv(ch)
#' mizu_close(ch)
#' }
#' @export
mizu_channel <- function(.expr, ..., .capacity = NULL, .timeout = 60,
                         language = c("r", "python")) {
  language <- match.arg(language)
  .capacity <- .channel_capacity(.capacity)
  if (language == "python") return(.python_channel(.expr, .capacity, .timeout, ...))
  vars <- list(...)
  if (length(vars) && (is.null(names(vars)) || any(names(vars) == ""))) {
    stop("the values in `...` must be named: they are the bindings the expression sees",
         call. = FALSE)
  }
  ptr <- .Call(wrap__channel_launch, .rscript(), .worker_args(".channel_main"),
               .capacity, .secs(.timeout, ".timeout"))
  ch <- .new_channel(ptr)
  r <- .Call(wrap__channel_send_batch, ptr, list(list(substitute(.expr), vars)))
  if (r[[1]] != 1L) stop("mizu: the channel peer did not take its task", call. = FALSE)
  ch
}

# The capacity as the native launch takes it: NULL for the runtime's default.
.channel_capacity <- function(capacity) {
  if (is.null(capacity)) return(NULL)
  if (!is.numeric(capacity) || length(capacity) != 1L || is.na(capacity)) {
    stop("`.capacity` must be a number of messages (or NULL)", call. = FALSE)
  }
  as.numeric(capacity)
}

# A channel to a Python peer running `source` (a string of Python code) with `channel` bound
# to its end (`python -m pymizu._peer --xlang`); messages cross as docs/interop.md says.
.python_channel <- function(source, capacity, timeout, ...) {
  if (length(list(...))) {
    stop("a Python peer gets no R bindings: put values in its source or send them",
         call. = FALSE)
  }
  if (!is.character(source) || length(source) != 1L || is.na(source)) {
    stop("for a Python peer, the first argument is its Python source code (one string)",
         call. = FALSE)
  }
  f <- tempfile("mizu-peer-", fileext = ".py")
  writeLines(source, f)
  on.exit(unlink(f))   # the peer read it before attaching
  ptr <- .Call(wrap__channel_launch, .python_program(),
               c("-m", "pymizu._peer", "--xlang", f), capacity,
               .secs(timeout, ".timeout"))
  .Call(wrap__channel_set_foreign, ptr)
  .new_channel(ptr)
}

# The peer of a Python program's channel (pymizu.Channel.spawn(source, language="r")):
# Rscript -e "mizu:::.channel_main_x()" <source file> <token>.
.channel_main_x <- function() {
  a <- commandArgs(trailingOnly = TRUE)
  n <- length(a)
  .attach_self()
  src <- readLines(a[[n - 1L]], warn = FALSE)
  ptr <- .Call(wrap__channel_attach, a[[n]])
  .Call(wrap__channel_set_foreign, ptr)
  ch <- .new_channel(ptr)
  env <- new.env(parent = globalenv())
  assign("channel", ch, envir = env)
  tryCatch({
    for (e in parse(text = src, keep.source = FALSE)) eval(e, env)
  }, finally = mizu_close(ch, wait = 0))
  invisible()
}

.new_channel <- function(ptr) {
  ch <- new.env(parent = emptyenv())
  ch$ptr <- ptr
  class(ch) <- "mizu_channel"
  ch
}

.channel_main <- function() {
  a <- commandArgs(trailingOnly = TRUE)
  .attach_self()
  ch <- .new_channel(.Call(wrap__channel_attach, a[[length(a)]]))
  task <- mizu_recv(ch)
  if (mizu_is_sentinel(task)) return(invisible())
  env <- list2env(task[[2]], parent = globalenv())
  assign("channel", ch, envir = env)
  tryCatch(eval(task[[1]], env), finally = mizu_close(ch))
  invisible()
}

.check_channel <- function(ch) {
  if (!inherits(ch, "mizu_channel")) stop("`ch` must be a mizu_channel", call. = FALSE)
}

#' @export
print.mizu_channel <- function(x, ...) {
  pid <- .Call(wrap__channel_peer_pid, x$ptr)
  cat("<mizu_channel", if (!is.na(pid) && !is.null(pid)) paste0(" to pid ", pid), ">\n", sep = "")
  invisible(x)
}

.send_status <- function(s) {
  switch(s, mizu_full, mizu_closed, mizu_peer_gone)
}

#' Send and receive on a channel
#'
#' `mizu_send()` never blocks: it returns `TRUE` (invisibly) when the value was sent, or the
#' sentinel `mizu_full` (the peer has not read enough yet), `mizu_closed` (this end was
#' closed) or `mizu_peer_gone` (the peer process died). `mizu_recv()` waits for a value and
#' returns it, or `mizu_timeout`, `mizu_closed` (the peer closed its end and everything it
#' sent was read) or `mizu_peer_gone` (it died, and everything it sent was read). Ctrl-C
#' interrupts the wait.
#'
#' @param ch A `mizu_channel` (the `channel` binding inside the peer).
#' @param value Any R value.
#' @param values A list of values.
#' @param timeout Seconds to wait.
#' @param max The most values to return.
#' @return See Description. `mizu_send_batch()` returns how many values were sent (they are
#'   sent in order; with attribute `status`, the sentinel that stopped the rest);
#'   `mizu_recv_batch()` a list of up to `max` values (waiting only for the first), or a
#'   sentinel when none came.
#' @examples
#' \donttest{
#' ch <- mizu_channel(mizu_send(channel, sum(mizu_recv(channel))))
#' mizu_send(ch, 1:10)
#' mizu_recv(ch, timeout = 30)
#' mizu_close(ch)
#' }
#' @export
mizu_send <- function(ch, value) {
  .check_channel(ch)
  r <- .Call(wrap__channel_send_batch, ch$ptr, list(value))
  if (r[[1]] == 1L) return(invisible(TRUE))
  .send_status(r[[2]])
}

#' @rdname mizu_send
#' @export
mizu_send_batch <- function(ch, values) {
  .check_channel(ch)
  if (!is.list(values)) stop("`values` must be a list", call. = FALSE)
  r <- .Call(wrap__channel_send_batch, ch$ptr, unname(values))
  n <- r[[1]]
  if (r[[2]] != 0L) attr(n, "status") <- .send_status(r[[2]])
  n
}

.recv_value <- function(r) {
  switch(as.character(r[[1]]),
         "0" = r[[2]],
         "1" = mizu_timeout,
         "2" = mizu_closed,
         "3" = mizu_peer_gone,
         "8" = .signal_interrupt())
}

#' @rdname mizu_send
#' @export
mizu_recv <- function(ch, timeout = Inf) {
  .check_channel(ch)
  .recv_value(.Call(wrap__channel_recv, ch$ptr, .secs(timeout, "timeout")))
}

#' @rdname mizu_send
#' @export
mizu_recv_batch <- function(ch, max = 64L, timeout = Inf) {
  .check_channel(ch)
  first <- mizu_recv(ch, timeout)
  if (mizu_is_sentinel(first)) return(first)
  out <- list(first)
  while (length(out) < max) {
    r <- .Call(wrap__channel_recv, ch$ptr, 0)
    if (r[[1]] != 0L) break
    out[length(out) + 1L] <- list(r[[2]])
  }
  out
}

#' Close a channel
#'
#' Closes this end: the peer reads what was sent, then receives `mizu_closed`. On the end
#' that started the peer, `wait` seconds are given for the peer to exit (it is killed after
#' that).
#'
#' @param ch A `mizu_channel`.
#' @param wait Seconds to wait for a launched peer to exit (`0`: do not wait).
#' @return The peer's exit code when it exited within `wait`, else `NA` (invisibly).
#' @examples
#' \donttest{
#' ch <- mizu_channel(NULL)
#' mizu_close(ch)
#' }
#' @export
mizu_close <- function(ch, wait = 5) {
  .check_channel(ch)
  if (wait > 0) {
    code <- .Call(wrap__channel_finish, ch$ptr, .secs(wait, "wait"))
    return(invisible(if (is.null(code)) NA_integer_ else code))
  }
  .Call(wrap__channel_close, ch$ptr)
  invisible(NA_integer_)
}
