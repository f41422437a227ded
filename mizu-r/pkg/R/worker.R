# The worker process: Rscript -e "mizu:::.worker_main()" <max_tasks> <init> <token> <slot>

.worker_state <- new.env(parent = emptyenv())

.worker_main <- function() {
  a <- commandArgs(trailingOnly = TRUE)
  n <- length(a)
  if (n < 4L) stop("usage: mizu:::.worker_main() <max_tasks> <init> <token> <slot>")
  max_tasks <- as.numeric(a[[n - 3L]])
  .attach_self()
  # Task errors are caught natively (R_ToplevelExec) and recorded by .note_error: R's default
  # handler must not print them on the worker's stderr as well.
  options(show.error.messages = FALSE)
  if (nzchar(a[[n - 2L]])) {
    h <- a[[n - 2L]]
    init <- unserialize(as.raw(strtoi(substring(h, seq(1L, nchar(h), 2L),
                                                seq(2L, nchar(h), 2L)), 16L)))
    eval(init, globalenv())
  }
  .Call(wrap__run_worker, a[[n - 1L]], as.integer(a[[n]]), .run_task, .task_failed,
        max_tasks)
  invisible()
}

# Tasks and channel peers see mizu's exported functions, as the caller does.
.attach_self <- function() {
  if (!"package:mizu" %in% search()) attachNamespace("mizu")
}

# The worker's executor (called by native code, which catches the errors): the task's value,
# with the warnings it raised (relayed to the caller, which signals them when it collects).
.run_task <- function(msg) {
  st <- .worker_state
  if (!is.null(st$error)) st$error <- st$trace <- NULL
  if (!is.null(st$warnings)) st$warnings <- NULL
  st$element <- NULL
  value <- withCallingHandlers(
    if (identical(msg[[1L]], "e")) eval(msg[[2L]], msg[[3L]])   # msg[[3]]: the environment
    else .dispatch(msg),
    error = .note_error, warning = .note_warning)
  if (is.null(st$warnings)) value
  else structure(list(value, st$warnings), class = "mizu_with_warnings")
}

.note_error <- function(e) {
  .worker_state$error <- e
  .worker_state$trace <- sys.calls()
}

.note_warning <- function(w) {
  .worker_state$warnings <- c(.worker_state$warnings, list(w))
  invokeRestart("muffleWarning")
}

# The error the last task raised (recorded by .note_error), as the caller gets it: with the
# task's call stack and, in a map, the failing element's position.
.task_failed <- function(msg) {
  e <- .worker_state$error
  if (!inherits(e, "condition") || !is.list(e)) {
    return(.mizu_condition("mizu_error", trimws(geterrmessage())))
  }
  e$traceback <- .traceback(.worker_state$trace)
  if (!is.null(.worker_state$element)) e$index <- .worker_state$element
  e
}

.dispatch <- function(msg) {
  if (identical(msg[[1L]], "m")) {
    return(.run_chunk(msg[[2]], msg[[3]], msg[[4]], msg[[5]], msg[[6]], msg[[7]]))
  }
  stop("mizu: unknown task kind")
}

# The calls of the task (without the worker's own frames), deparsed.
.traceback <- function(calls) {
  name <- function(cl) if (is.name(cl[[1]])) as.character(cl[[1]]) else ""
  nm <- vapply(calls, name, "")
  at <- which(nm %in% c(".run_task", ".run_chunk"))
  if (length(at)) {
    keep <- seq_along(calls) > at[[length(at)]]
    calls <- calls[keep]
    nm <- nm[keep]
  }
  lead <- cumprod(nm %in% c("withCallingHandlers", "eval", "do.call", ".dispatch")) == 1
  trail <- rev(cumprod(rev(nm) %in% c(".handleSimpleError", "h")) == 1)
  calls <- calls[!(lead | trail)]
  vapply(calls, function(cl) paste(deparse(cl, nlines = 1L), collapse = ""), "")
}
