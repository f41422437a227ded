# The worker process: Rscript -e "mizu:::.worker_main()" <max_tasks> <init> <token> <slot>

.worker_state <- new.env(parent = emptyenv())

.worker_main <- function() {
  .Call(wrap__exit_if_orphaned_while_starting)
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
  .Call(wrap__run_worker, a[[n - 1L]], as.integer(a[[n]]), .handlers_call(), .dispatch,
        .task_failed, .with_warnings, .worker_state, max_tasks, .xerror_parts,
        .xwarning_messages)
  invisible()
}

# What withCallingHandlers(expr, error = .note_error, warning = .note_warning) establishes,
# as calls with constant arguments: `add` pushes the handlers, `now` (no handlers) returns the
# handler stack. Native code evaluates both once and installs the stack they made before each
# task, in the task's own top-level context (see src/worker.rs): the handlers last until that
# context ends, and no closure call or allocation is spent on them per task.
.handlers_call <- function() {
  internal <- function(...) as.call(list(as.name(".Internal"), as.call(list(...))))
  list(add = internal(as.name(".addCondHands"), c("error", "warning"),
                      list(.note_error, .note_warning), globalenv(), NULL, TRUE),
       now = internal(as.name(".addCondHands"), NULL, NULL, NULL, NULL, TRUE))
}

# Tasks and channel peers see mizu's exported functions, as the caller does.
.attach_self <- function() {
  if (!"package:mizu" %in% search()) attachNamespace("mizu")
}

# A task's value with the warnings it raised (relayed to the caller, which signals them when
# it collects).
.with_warnings <- function(value) {
  w <- .worker_state$warnings
  .worker_state$warnings <- NULL
  structure(list(value, w), class = "mizu_with_warnings")
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
# Reading it resets what the handlers recorded, for the next task.
.task_failed <- function(unused = NULL) {
  st <- .worker_state
  e <- st$error
  trace <- st$trace
  element <- st$element
  st$error <- st$trace <- st$element <- st$warnings <- NULL
  if (!inherits(e, "condition") || !is.list(e)) {
    return(.mizu_condition("mizu_error", trimws(geterrmessage())))
  }
  e$traceback <- .traceback(trace)
  if (!is.null(element)) e$index <- element
  # A variable the task needs but the worker does not have: say how to send it.
  missing <- regmatches(e$message, regexec("^object '(.+)' not found$", e$message))[[1L]]
  if (length(missing) == 2L) {
    e$message <- sprintf(paste0(
      "%s on the worker: pass it with the task (mizu_submit(pool, expr, %s = %s), or a named ",
      "argument of mizu_map()), or define it inside the task"), e$message, missing[[2L]],
      missing[[2L]])
  }
  class(e) <- unique(c("mizu_error_task", class(e)))
  e
}

# Tasks other than plain expressions (native code evaluates those itself).
.dispatch <- function(msg) {
  if (identical(msg[[1L]], "m")) return(.run_chunk(msg))
  if (identical(msg[[1L]], "e")) {
    # The packages the expression uses, attached first, and its globals (see
    # .expr_message()), bound while it runs. (The worker's native path does this for every
    # well-formed message; this is its fallback, with the same C routines.)
    if (length(msg) >= 5L) .Call(.native_attach_packages, msg[[5L]])
    if (length(msg) >= 4L && !is.null(msg[[4L]])) {
      bound <- .bind_globals(msg[[4L]])
      on.exit(.unbind_globals(bound), add = TRUE)
    }
    return(eval(msg[[2L]], msg[[3L]], globalenv()))
  }
  if (identical(msg[[1L]], "x")) {
    return(.xrun(msg[[2L]], msg[[3L]], msg[[4L]], msg[[5L]], msg[[6L]], msg[[7L]]))
  }
  if (identical(msg[[1L]], "xm")) {
    return(.xrun_chunk(msg[[2L]], msg[[3L]], msg[[4L]], msg[[5L]], msg[[6L]], msg[[7L]], msg[[8L]]))
  }
  stop("mizu: unknown task kind")
}

# A cross-language task (a call from a Python pool, see docs/interop.md): `target` names a
# function (`pkg::fun`, or a name found from the global environment), or with `source` is R
# code run with `kwargs` bound as variables (its value is the last expression's).
.xrun <- function(target, source, args, kwargs, seed, index) {
  if (!is.null(seed)) {
    saved <- .rng_switch()
    on.exit(.rng_restore(saved))
    .Call(wrap__rng_enter, seed, index)
  }
  if (source) {
    env <- list2env(kwargs, parent = globalenv())
    v <- NULL
    for (e in parse(text = target, keep.source = FALSE)) v <- eval(e, env)
    return(v)
  }
  do.call(.xfunction(target), c(args, kwargs), quote = TRUE)
}

# The function a cross-language call names: `pkg::fun`, or a name found from the global
# environment.
.xfunction <- function(target) {
  f <- if (grepl("::", target, fixed = TRUE)) {
    eval(str2lang(target), baseenv())
  } else {
    get(target, envir = globalenv(), mode = "function")
  }
  if (!is.function(f)) stop(sprintf("`%s` is not a function", target), call. = FALSE)
  f
}

# A chunk of a cross-language map: element j (index `first + j - 1` in the map, from 0) is
# appended to the arguments (its items when `spread`) and runs on the stream (seed, index).
# A failing element's index reaches the caller through the handlers (.task_failed).
.xrun_chunk <- function(target, args, kwargs, seed, first, xs, spread) {
  f <- .xfunction(target)
  st <- .worker_state
  if (!is.null(seed)) {
    saved <- .rng_switch()
    on.exit(.rng_restore(saved))
  }
  out <- vector("list", length(xs))
  plain <- !spread && !length(args) && !length(kwargs)
  for (j in seq_along(xs)) {
    i <- first + j - 1
    st$element <- i
    if (!is.null(seed)) .Call(wrap__rng_enter, seed, i)
    r <- if (plain) {
      f(xs[[j]])
    } else {
      do.call(f, c(args, if (spread) xs[[j]] else list(xs[[j]]), kwargs), quote = TRUE)
    }
    if (!is.null(r)) out[[j]] <- r
  }
  st$element <- NULL
  out
}

# The messages of the warnings in .with_warnings()'s value (for a caller of another language).
.xwarning_messages <- function(w) {
  vapply(w[[2]], function(c) paste(conditionMessage(c), collapse = "\n"), "")
}

# What a Python caller gets of an R error: list(classes, message, call, traceback), each
# text, and the failing element's index in a map chunk (or NULL).
.xerror_parts <- function(e) {
  short <- function(x) {
    if (is.null(x)) return("")
    s <- paste(deparse(x, nlines = 1L, width.cutoff = 200L), collapse = "")
    if (nchar(s) > 200L) paste0(substr(s, 1L, 197L), "...") else s
  }
  if (!inherits(e, "condition")) {
    return(list("error", trimws(geterrmessage()), "", "", NULL))
  }
  tb <- e$traceback
  list(class(e), conditionMessage(e), short(conditionCall(e)),
       if (is.character(tb)) paste(tb, collapse = "\n") else "",
       if (is.numeric(e$index)) e$index)
}

# The calls of the task (without the worker's own frames), deparsed.
.traceback <- function(calls) {
  name <- function(cl) if (is.name(cl[[1]])) as.character(cl[[1]]) else ""
  nm <- vapply(calls, name, "")
  at <- which(nm %in% c(".dispatch", ".run_chunk", ".xrun_chunk"))
  if (length(at)) {
    keep <- seq_along(calls) > at[[length(at)]]
    calls <- calls[keep]
    nm <- nm[keep]
  }
  lead <- cumprod(nm %in% c("withCallingHandlers", "eval", "do.call", ".dispatch", "call_f")) == 1
  trail <- rev(cumprod(rev(nm) %in% c(".handleSimpleError", "h")) == 1)
  calls <- calls[!(lead | trail)]
  vapply(calls, function(cl) paste(deparse(cl, nlines = 1L), collapse = ""), "")
}
