# Pools, tasks and collection.

.rscript <- function() {
  file.path(R.home("bin"), "Rscript")
}

# The command line of a worker: Rscript with this session's library paths, then the runtime
# appends the pool token and the slot number.
.worker_args <- function(entry, extra = character()) {
  libs <- paste0("c(", paste(encodeString(.libPaths(), quote = '"'), collapse = ", "), ")")
  c("--no-save", "--no-restore", "--no-echo", "-e",
    sprintf(".libPaths(%s); mizu:::%s()", libs, entry), extra)
}

.secs <- function(x, what, null = Inf) {
  if (is.null(x)) return(null)
  if (!is.numeric(x) || length(x) != 1L || is.na(x) || x < 0) {
    stop(sprintf("`%s` must be a non-negative number of seconds (or NULL)", what), call. = FALSE)
  }
  as.numeric(x)
}

#' Start a pool of R worker processes
#'
#' Workers are fresh `Rscript` processes that see this session's library paths (not its
#' global variables: tasks carry what they need, see [mizu_submit()]). They exchange tasks and
#' results with this session through shared memory.
#'
#' @param n_workers Number of worker processes.
#' @param exec_timeout Seconds a task may run before its worker is killed and replaced (the
#'   task fails with class `mizu_error_exec_timeout`); `NULL` for no limit.
#' @param submit_timeout Seconds a submission may wait for room in the workers' queues before
#'   failing with class `mizu_error_submit_timeout`; `NULL` waits as long as it takes.
#' @param respawn Replace workers that die.
#' @param max_tasks Tasks a worker runs before it is replaced by a fresh one (`NULL`: no limit).
#' @param init An expression (quoted, e.g. `quote(library(stats))`) each worker evaluates in
#'   its global environment when it starts.
#' @param slots Tasks that may be in flight (submitted and not yet collected) at once.
#' @param language `"r"` (R workers running R expressions) or `"python"`: Python workers
#'   (`python -m pymizu.worker`, with the interpreter in `MIZU_PYTHON` or `python3` on the
#'   path, which must have the `pymizu` package) running [mizu_call()] tasks; values cross as
#'   `docs/interop.md` says (numeric vectors as zero-copy views).
#' @return A `mizu_pool`. Stop it with [mizu_pool_stop()] (it is also stopped when it is
#'   garbage collected or R exits).
#' @examples
#' \donttest{
#' pool <- mizu_pool(2)
#' mizu_collect(mizu_submit(pool, x + 1, x = 41))
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_pool <- function(n_workers = 1L, exec_timeout = NULL, submit_timeout = NULL,
                      respawn = TRUE, max_tasks = NULL, init = NULL, slots = 4096L,
                      language = c("r", "python")) {
  language <- match.arg(language)
  limits <- .Call(wrap__pool_limits)
  if (!is.numeric(n_workers) || length(n_workers) != 1L || is.na(n_workers) ||
      n_workers < 1 || n_workers > limits[[1]] || n_workers != round(n_workers)) {
    stop(sprintf("`n_workers` must be a whole number in 1..%d", limits[[1]]), call. = FALSE)
  }
  if (!is.numeric(slots) || length(slots) != 1L || is.na(slots) || slots < 1 ||
      slots > limits[[2]] || slots != round(slots)) {
    stop(sprintf("`slots` must be a whole number in 1..%d", limits[[2]]), call. = FALSE)
  }
  if (!is.null(max_tasks) && (!is.numeric(max_tasks) || length(max_tasks) != 1L ||
                              is.na(max_tasks) || max_tasks < 1)) {
    stop("`max_tasks` must be a positive number (or NULL)", call. = FALSE)
  }
  if (!is.logical(respawn) || length(respawn) != 1L || is.na(respawn)) {
    stop("`respawn` must be TRUE or FALSE", call. = FALSE)
  }
  if (language == "python") {
    if (!is.null(init)) stop("`init` is R code: a Python pool has none", call. = FALSE)
    program <- .python_program()
    args <- c("-m", "pymizu.worker", "--workers", as.character(as.integer(n_workers)),
              if (!is.null(max_tasks)) c("--max-tasks", format(max_tasks, scientific = FALSE)))
  } else {
    extra <- c(if (is.null(max_tasks)) "0" else format(max_tasks, scientific = FALSE),
               if (is.null(init)) "" else .hex(serialize(init, NULL, xdr = FALSE)))
    program <- .rscript()
    args <- .worker_args(".worker_main", extra)
  }
  p <- .Call(wrap__pool_new, as.integer(n_workers), program, args, as.integer(slots),
             .secs(exec_timeout, "exec_timeout"), .secs(submit_timeout, "submit_timeout"),
             respawn, language == "python")
  if (is.character(p)) .raise_failure(p)
  p
}

.hex <- function(r) paste(as.character(r), collapse = "")

#' The pool running the current task
#'
#' Inside a task, returns a handle that submits to the pool running it: nested
#' [mizu_submit()] and [mizu_map()] calls run on the same workers, and waiting for them runs
#' other tasks meanwhile, so nesting never deadlocks, even with one worker.
#'
#' @return A `mizu_pool` usable inside the task; an error outside tasks.
#' @examples
#' \donttest{
#' pool <- mizu_pool(1)
#' mizu_collect(mizu_submit(pool, {
#'   inner <- mizu::mizu_current_pool()
#'   sum(unlist(mizu::mizu_map(inner, 1:4, function(i) i * 10)))
#' }))
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_current_pool <- function() {
  if (!.Call(wrap__in_task)) {
    .stop("mizu_error", "mizu_current_pool() is only available inside a mizu task")
  }
  .Call(wrap__pool_nested)
}

#' Stop a pool
#'
#' Queued tasks are cancelled, running ones fail (class `mizu_error_stopped`), results not
#' collected yet are dropped, the workers exit and their shared memory is removed.
#' Idempotent.
#'
#' @param pool A [mizu_pool()].
#' @param grace Seconds to wait for workers to exit before they are killed.
#' @return `pool`, invisibly.
#' @examples
#' \donttest{
#' pool <- mizu_pool(1)
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_pool_stop <- function(pool, grace = 5) {
  .Call(wrap__pool_stop, pool, .secs(grace, "grace"))
  invisible(pool)
}

#' Pool status
#'
#' @param pool A [mizu_pool()].
#' @return A data frame with one row per worker: `slot`, `pid`, `state`, `busy` (running a
#'   task), `tasks` (tasks run) and `steals` (tasks taken from other workers' queues).
#' @examples
#' \donttest{
#' pool <- mizu_pool(2)
#' mizu_pool_status(pool)
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_pool_status <- function(pool) {
  s <- .Call(wrap__pool_status, pool)
  data.frame(slot = s[[1]], pid = s[[2]], state = s[[3]], busy = s[[4]],
             tasks = s[[5]], steals = s[[6]], stringsAsFactors = FALSE)
}

#' @export
print.mizu_pool <- function(x, ...) {
  info <- .Call(wrap__pool_info, x)
  if (info[[2]]) {
    cat("<mizu_pool: the pool running this task>\n")
  } else if (!info[[3]]) {
    cat("<mizu_pool: stopped>\n")
  } else {
    s <- mizu_pool_status(x)
    cat(sprintf("<mizu_pool: %d workers, %d busy, %s tasks run>\n", nrow(s), sum(s$busy),
                format(sum(s$tasks), big.mark = ",")))
  }
  invisible(x)
}

# A submission result: the task, or a failure c(class, message) to raise.
.submitted <- function(r) {
  if (is.character(r)) .raise_failure(r)
  r
}

# The Python interpreter for Python workers (MIZU_PYTHON, else python3 on the path), checked
# once per session to have pymizu.
.python_state <- new.env(parent = emptyenv())

.python_program <- function() {
  py <- Sys.getenv("MIZU_PYTHON", "")
  if (!nzchar(py)) py <- Sys.which("python3")[[1]]
  if (!nzchar(py)) {
    stop("Python workers need Python: no python3 on the PATH (install Python 3.11+ and ",
         "`pip install pymizu`, or set MIZU_PYTHON to an interpreter that has it)", call. = FALSE)
  }
  if (!identical(.python_state$ok, py)) {
    st <- suppressWarnings(system2(py, c("-c", shQuote("import pymizu")), stdout = FALSE,
                                   stderr = FALSE))
    if (!identical(st, 0L)) {
      stop(sprintf(paste0("Python workers need the pymizu package: `%s -c \"import pymizu\"` ",
                          "failed (`pip install pymizu`, or set MIZU_PYTHON to an ",
                          "interpreter that has it)"), py), call. = FALSE)
    }
    .python_state$ok <- py
  }
  py
}

#' A call for a worker of another language
#'
#' What a pool of Python workers ([mizu_pool()] with `language = "python"`) runs:
#' `mizu_call("statistics.fmean", x)` calls a Python function named `module.function` (or
#' `module:object.attribute`, or a builtin such as `"sum"`) with the arguments; `mizu_call(source
#' = "import numpy as np\nfloat(np.sum(x))", x = v)` runs Python source with the named
#' arguments bound as variables, and its value is the last expression's. Arguments cross as
#' `docs/interop.md` says: numeric vectors as numpy arrays (zero-copy), data frames as Arrow
#' tables, named lists as dicts. Values that cannot cross (environments, functions, external
#' pointers) fail at submit with class `mizu_error_not_portable`, naming where they sit.
#' In [mizu_map()], each element is appended to the arguments.
#'
#' @param .target A function's qualified name (`NULL` with `source`).
#' @param ... Arguments (named ones are keyword arguments).
#' @param source Source text to run instead of a named function.
#' @return A `mizu_call`.
#' @examples
#' mizu_call("statistics.fmean", c(1, 2, 3))
#' mizu_call(source = "x * 2", x = 21)
#' @export
mizu_call <- function(.target = NULL, ..., source = NULL) {
  target <- .target
  args <- list(...)
  nm <- names(args)
  named <- if (is.null(nm)) rep(FALSE, length(args)) else nzchar(nm)
  if (is.null(source) == is.null(target)) {
    stop("mizu_call() needs either a target name (`.target`) or `source`, not both",
         call. = FALSE)
  }
  if (!is.null(source)) {
    if (!is.character(source) || length(source) != 1L || is.na(source)) {
      stop("`source` must be one string", call. = FALSE)
    }
    if (!all(named)) stop("a source call takes named arguments only", call. = FALSE)
    return(structure(list(target = source, source = TRUE, args = list(), kwargs = args),
                     class = "mizu_call"))
  }
  if (!is.character(target) || length(target) != 1L || is.na(target) || !nzchar(target)) {
    stop("`.target` must be one non-empty string", call. = FALSE)
  }
  structure(list(target = target, source = FALSE, args = unname(args[!named]),
                 kwargs = args[named]), class = "mizu_call")
}

#' @export
print.mizu_call <- function(x, ...) {
  if (x$source) cat("<mizu_call: source>\n") else cat("<mizu_call: ", x$target, ">\n", sep = "")
  invisible(x)
}

# Called by the native submit (src/shims.c) for an expression that may use variables it does
# not bind when the frame it was given holds no `.expr` promise to say where the expression
# was written (the future backend's submit): `f` is that frame, and the expression's globals
# are found from where its function was called.
.submit_globals <- function(pool, vars, f, expr) {
  # (`do.call` evaluates in `f` without a context of its own, which `eval` would add and
  # `parent.frame()` would then answer with.)
  env <- do.call(parent.frame, list(), envir = f)
  msg <- .expr_message(expr, vars, env)
  r <- .Call(.native_submit, pool, msg)
  if (is.character(r)) .raise_failure(r)
  r
}

# An expression task's message: list("e", expr, vars), with the globals `expr` uses (found
# from `env`, where it was written: the names codetools finds in it, other than those of
# `vars`, that resolve to the global environment or a function's frame, not to a package;
# then those of the functions among them and among `vars`, as for a map's function) among the
# bindings. When one of those functions finds variables in the global environment, the
# globals found there go as a fourth element instead, bound in the worker's global environment
# while the task runs; those found in a function's frame stay among the bindings, which only
# the expression sees. Names found in neither but in a package attached here (other than
# the ones every worker attaches) make a fifth element, after a NULL fourth if need be:
# their names, NA, and the packages attached here in search-path order, which the worker's
# search path is made to agree with first. A global that cannot be sent raises its
# failure. (C, in src/globals.c and src/packages.c: it runs at every submit of such an
# expression.)
.expr_message <- function(expr, vars, env) .Call(.native_expr_message, expr, vars, env)

# codetools::findGlobals() of an expression, found once per expression and remembered for the
# next submits of it (a loop submits the same call each time; src/globals.c looks there first
# and calls this on a miss).
.expr_names <- function(expr) {
  i <- .Call(.native_find_identical, .maps$exprs, expr)
  if (i) return(.maps$exprs[[i]][[2L]])
  f <- function() NULL
  body(f) <- expr
  nm <- codetools::findGlobals(f)
  .maps$exprs <- c(list(list(expr, nm)), utils::head(.maps$exprs, 63L))
  nm
}

#' Submit a task
#'
#' `.expr` is captured unevaluated and evaluated on a worker, in a new environment whose
#' bindings are the named values in `...` and whose parent is the worker's global
#' environment. Variables `.expr` uses without a binding in `...` — found where it was
#' written, in the global environment or a function's frame, the way `future` finds globals
#' (`codetools`) — travel with it and are bound in the worker's global environment while the
#' task runs (so are those of the global functions it calls). Values travel through shared memory: vectors and data frames of 4 KiB or
#' more are copied once and arrive as views. The function's own arguments start with a dot
#' so that no binding is taken for one of them (R matches a named argument to a formal it
#' is a prefix of: a binding `e` would otherwise be taken as `expr`). An environment or an
#' external pointer cannot be a binding (nor sit in a list that is one): the worker would get
#' a copy or a null pointer, so the submit fails with class `mizu_error_not_portable`, naming
#' the binding.
#'
#' @param .pool A [mizu_pool()] (or [mizu_current_pool()] inside a task).
#' @param .expr An expression, evaluated on a worker. For a pool of Python workers, a
#'   [mizu_call()] (evaluated here).
#' @param ... Named values: the bindings `.expr` sees (for a Python pool, further keyword
#'   arguments of the call).
#' @return A `mizu_task`: collect it with [mizu_collect()].
#' @examples
#' \donttest{
#' pool <- mizu_pool(1)
#' t <- mizu_submit(pool, sum(x) * k, x = 1:10, k = 2)
#' mizu_collect(t)
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_submit <- function(.pool, .expr, ...) {
  # (The native routine takes `.pool`, `substitute(.expr)` and `list(...)` from this frame,
  # which `.External2` passes it, and raises its failures itself: see src/shims.c.)
  .External2(.native_submit_frame)
}

#' Submit several tasks at once
#'
#' One publication per worker queue for the whole batch (cheaper than submitting one by one).
#'
#' @param .pool A [mizu_pool()].
#' @param .exprs A list of quoted expressions (e.g. from `quote()`, `bquote()` or
#'   `lapply(1:3, function(i) bquote(sqrt(.(i))))`).
#' @param ... Named values: the bindings every expression sees. Globals are found as for
#'   [mizu_submit()], from where `mizu_submit_batch()` is called.
#' @return A list of `mizu_task`s (with the names of `.exprs`).
#' @examples
#' \donttest{
#' pool <- mizu_pool(2)
#' ts <- mizu_submit_batch(pool, lapply(1:3, function(i) bquote(.(i) * k)), k = 10)
#' mizu_collect_all(ts)
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_submit_batch <- function(.pool, .exprs, ...) {
  if (!is.list(.exprs)) stop("`.exprs` must be a list of quoted expressions", call. = FALSE)
  vars <- list(...)
  # The common batch (no expression uses the caller's variables) is encoded and submitted
  # natively in one call, as mizu_submit() does one task; NULL means any other batch.
  r <- .Call(.native_submit_exprs, .pool, .exprs, vars)
  if (!is.null(r)) {
    if (!is.null(r[[2]])) .raise_failure(r[[2]])
    tasks <- r[[1]]
    names(tasks) <- names(.exprs)
    return(tasks)
  }
  env <- parent.frame()
  msgs <- lapply(.exprs, function(e) {
    if (.Call(wrap__may_use_globals, e, vars)) .expr_message(e, vars, env) else list("e", e, vars)
  })
  .submit_many(.pool, msgs, names(.exprs))
}

.submit_many <- function(pool, msgs, nms = NULL) {
  if (!length(msgs)) return(list())
  # (NULL: not a live pool; the extendr routine says so.)
  r <- .Call(.native_submit_msgs, pool, msgs)
  if (is.null(r)) r <- .Call(wrap__pool_submit_batch, pool, unname(msgs))
  if (!is.null(r[[2]])) {
    # What was submitted keeps running; its handles are dropped (results abandoned).
    .raise_failure(r[[2]])
  }
  tasks <- r[[1]]
  names(tasks) <- nms
  tasks
}

#' @export
print.mizu_task <- function(x, ...) {
  st <- if (.Call(wrap__task_collected, x)) "collected"
        else if (.Call(wrap__task_done, x)) "finished" else "pending"
  cat("<mizu_task: ", st, ">\n", sep = "")
  invisible(x)
}

# The value of an outcome list(status, value, slot, pid, message) from task_collect, or the
# condition it stands for raised; status 6 (not finished) gives mizu_timeout.
.value <- function(o, index = NULL) {
  st <- o[[1]]
  if (st == 0L) return(o[[2]])
  if (st == 10L) {
    for (w in o[[2]][[2]]) warning(w)
    return(o[[2]][[1]])
  }
  if (st == 6L) return(mizu_timeout)
  if (st == 8L) .signal_interrupt()
  e <- switch(
    as.character(st),
    "1" = .remote_condition(o[[2]]),
    "2" = .mizu_condition("mizu_error_worker_died", o[[5]], slot = o[[3]], pid = o[[4]]),
    "3" = .mizu_condition("mizu_error_exec_timeout", o[[5]], slot = o[[3]], pid = o[[4]]),
    "4" = .mizu_condition("mizu_error_cancelled", "the task was cancelled"),
    "5" = .mizu_condition("mizu_error_stopped", "the pool stopped before the task finished"),
    .mizu_condition("mizu_error", paste("mizu:", o[[5]]))
  )
  if (!is.null(index)) e$index <- index
  stop(e)
}

.remote_condition <- function(e) {
  if (!inherits(e, "condition")) {
    return(.mizu_condition("mizu_error", "mizu: malformed error from a worker"))
  }
  if (inherits(e, "mizu_error_task")) e <- .package_hint(e)
  e
}

# A task that failed for a name the worker does not have, which this session finds in an
# attached package: the error says which, and how to get it to the workers. An installed
# package is attached there by library(); the packages a task's code names go with it (see
# .expr_message()), so this is a name it reaches otherwise (`get("fread")`). An environment
# attached under a package's name (`attach(list(...), name = "package:x")`) is no package a
# worker can attach: the name goes with the task, or `init` makes it.
.package_hint <- function(e) {
  m <- conditionMessage(e)
  name <- regmatches(m, regexec("^object '(.+)' not found on the worker", m))[[1L]]
  what <- "object"
  if (length(name) != 2L) {
    name <- regmatches(m, regexec("^could not find function \"(.+)\"$", m))[[1L]]
    what <- "function"
  }
  if (length(name) != 2L) return(e)
  n <- name[[2L]]
  where <- .attached_package_of(n)
  if (is.null(where)) return(e)
  shown <- if (what == "object") sprintf("object '%s'", n) else sprintf("function \"%s\"", n)
  pkg <- substring(where, 9L)
  e$message <- if (!is.null(attr(as.environment(where), "path"))) {
    sprintf(paste0(
      "%s not found on the worker: it is package %s's, attached in this session but not in ",
      "the workers; attach it there with library(%s) in the task, or start the pool with ",
      "mizu_pool(n, init = quote(library(%s)))"), shown, pkg, pkg, pkg)
  } else {
    sprintf(paste0(
      "%s not found on the worker: it is in %s, attached in this session (not an installed ",
      "package the workers could attach); pass it with the task (%s = %s), or make it in ",
      "the workers with mizu_pool(n, init = ...)"), shown, where, n, n)
  }
  e
}

# Where on this session's search path (after the global environment, before base) `name` is
# found in an environment attached as a package ("package:..."), or NULL.
.attached_package_of <- function(name) {
  for (where in search()[-1L]) {
    if (!startsWith(where, "package:") || where == "package:base") next
    if (exists(name, where = where, inherits = FALSE)) return(where)
  }
  NULL
}

#' Collect a task's value
#'
#' Waits for the task and returns its value. An error in the task is raised here with its
#' original class and message; the call it happened in is its `call` (shown when printed) and
#' the worker's call stack (deparsed calls) is its field `traceback`. Failures of the
#' machinery have classes `mizu_error_worker_died` (fields `slot`, `pid`),
#' `mizu_error_exec_timeout`, `mizu_error_cancelled` and `mizu_error_stopped`, all inheriting
#' `mizu_error`. Ctrl-C interrupts the wait (the task stays valid). Collecting again returns
#' the same value (or raises the same error).
#'
#' @param task A `mizu_task` from [mizu_submit()].
#' @param timeout Seconds to wait; after that, `mizu_timeout` is returned and the task stays
#'   valid.
#' @return The task's value, or `mizu_timeout`.
#' @examples
#' \donttest{
#' pool <- mizu_pool(1)
#' t <- mizu_submit(pool, { Sys.sleep(0.5); "done" })
#' mizu_collect(t, timeout = 0)   # mizu_timeout
#' mizu_collect(t)                # "done"
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_collect <- function(task, timeout = Inf) {
  # (The native routine calls .value() itself when the outcome is not a plain value.)
  .Call(.native_collect_value, task, timeout)
}

.check_tasks <- function(tasks) {
  if (!.Call(.native_tasks_ok, tasks)) {
    stop("`tasks` must be a list of mizu_task", call. = FALSE)
  }
}

#' Collect whichever task finishes first
#'
#' @param tasks A list of `mizu_task`s. Tasks already collected are skipped.
#' @param timeout Seconds to wait; after that, `mizu_timeout` is returned.
#' @return `list(index, value)`: the position of a finished task in `tasks` and its value
#'   (its error is raised, with field `index`), or `mizu_timeout`.
#' @examples
#' \donttest{
#' pool <- mizu_pool(2)
#' ts <- list(mizu_submit(pool, { Sys.sleep(1); "slow" }), mizu_submit(pool, "fast"))
#' mizu_collect_any(ts)$value
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_collect_any <- function(tasks, timeout = Inf) {
  # (The native wait checks each element: a check in R first would cost as much again.)
  if (!is.list(tasks)) {
    stop("`tasks` must be a list of mizu_task", call. = FALSE)
  }
  i <- .Call(wrap__task_wait_any, tasks, timeout)
  if (i == -2L) stop("every task was already collected", call. = FALSE)
  if (i == -1L) .signal_interrupt()
  if (i == 0L) return(mizu_timeout)
  list(index = i, value = .value(.Call(.native_collect, tasks[[i]], 0), index = i))
}

#' Collect every task, in order
#'
#' @param tasks A list of `mizu_task`s.
#' @param timeout Seconds to wait for all of them; after that, `mizu_timeout` is returned and
#'   the tasks stay valid.
#' @return The values, in the order (and with the names) of `tasks`. The first failure by
#'   position is raised, with its position in field `index`.
#' @examples
#' \donttest{
#' pool <- mizu_pool(2)
#' mizu_collect_all(list(a = mizu_submit(pool, 1), b = mizu_submit(pool, 2)))
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_collect_all <- function(tasks, timeout = Inf) {
  .check_tasks(tasks)
  timeout <- .secs(timeout, "timeout")
  end <- if (is.finite(timeout)) proc.time()[[3L]] + timeout
  nt <- length(tasks)
  out <- NULL
  k <- 1L
  repeat {
    left <- if (is.null(end)) Inf else max(0, end - proc.time()[[3L]])
    # The plain values from task k on, collected natively (every value is wanted: the runtime
    # decides how long to sleep before the next, see mizu_map()), up to the first task with
    # any other outcome, which is handled here: list(values, code, outcome).
    r <- .Call(.native_collect_values, tasks, k, left)
    got <- length(r[[1L]])
    if (k == 1L && got == nt) {
      out <- r[[1L]]
      break
    }
    if (is.null(out)) out <- vector("list", nt)
    if (got > 0L) out[k:(k + got - 1L)] <- r[[1L]]
    k <- k + got
    code <- r[[2L]]
    if (code == 0L) break
    if (code == 2L) return(mizu_timeout)
    if (code == 3L) {
      .signal_interrupt()
      next
    }
    o <- r[[3L]]
    if (o[[1L]] == 6L) return(mizu_timeout)
    v <- .value(o, index = k)
    if (!is.null(v)) out[[k]] <- v
    k <- k + 1L
  }
  names(out) <- names(tasks)
  out
}

#' Cancel a task that has not started
#'
#' @param task A `mizu_task`.
#' @return `TRUE` if the task will never run (collecting it raises `mizu_error_cancelled`),
#'   `FALSE` if it already started or finished.
#' @examples
#' \donttest{
#' pool <- mizu_pool(1)
#' busy <- mizu_submit(pool, Sys.sleep(1))
#' queued <- mizu_submit(pool, "never")
#' mizu_cancel(queued)
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_cancel <- function(task) .Call(wrap__task_cancel, task)
