# A backend for the `future` package: plan(mizu::mizu_future, workers = n) runs each future as
# a task on a mizu pool that the plan owns. `future` (>= 1.31) gathers globals and packages
# and builds the expression that evaluates the future on a worker and returns its
# FutureResult (value, conditions, stdout, RNG state); this file launches that expression,
# polls and collects it, and manages the pool's lifetime.

# The plan's pool: `pool`, its size `n`, the futures launched and not yet collected
# (`active`, an environment keyed by launch number) and the share-once cache of large
# globals (`shared`).
.fut <- new.env(parent = emptyenv())
.fut$active <- new.env(parent = emptyenv())
.fut$launched <- 0
.fut$wrappers <- 0
.fut$n_active <- 0L
.fut$shared <- list()

# Futures launched and not collected, at most: past it, launching collects the oldest first
# (as `future`'s own cluster backends wait for a free worker) so that results nobody asked
# for yet do not pile up.
.FUTURE_BACKLOG <- 1024L

# What a worker evaluates for a future (with `expr`, `globals`, `relay` and `wrapper` bound):
# .future_run(), found in mizu's namespace.
.FUTURE_TASK <- quote(get(".future_run", envir = asNamespace("mizu"))(expr, globals, relay,
                                                                      wrapper))

# `future` evaluates a future's expression inside a wrapper of its own (conditions, output,
# options, RNG): some 30 KB serialized, the same for every future of the same settings, and
# serializing it took a trivial future's launch longer than its evaluation. The wrapper is made
# around this symbol instead, serialized and shared once while it stays the same, and kept
# unserialized by each worker; the worker puts the future's own expression in its place.
.FUTURE_HOLE <- quote(.mizu_future_expr)

#' A `future` backend running futures on a mizu pool
#'
#' Use it through [future::plan()]: `plan(mizu::mizu_future, workers = 2)`. Every future
#' (from `future()`, `\%<-\%`, `future.apply`, `furrr`, `doFuture`, ...) then runs as a task on
#' a pool of `workers` R processes that the plan starts once and keeps warm; switching to
#' another plan stops the pool. Globals and packages found by `future` travel with each
#' future, large vectors as shared-memory views (a vector of 1 MiB or more that several
#' futures use is copied into shared memory once, not once per future); values, conditions,
#' captured output and errors come back as `future` specifies; seeded futures
#' (`seed = TRUE`, `future.seed`) give the numbers `plan(sequential)` gives. Messages and
#' warnings are relayed when a future's result is collected; immediate conditions
#' (`progressr` progress updates) while it runs, whenever the caller waits for or polls it. A worker that dies while running a future fails that future with a
#' `FutureError`; the pool replaces the worker and serves on.
#'
#' Past one machine, nest it under `future`'s cluster plan: each node runs its own mizu
#' pool, e.g. `plan(list(tweak(cluster, workers = c("n1", "n2")), tweak(mizu_future,
#' workers = 8)))`.
#'
#' @param expr,envir,substitute,lazy,seed,globals,packages,... As for [future::future()]
#'   (this function is called by `future`, not directly).
#' @param workers Number of worker processes (default: [future::availableCores()]).
#' @return A `MizuFuture` (a `future::Future`).
#' @examples
#' \donttest{
#' if (requireNamespace("future", quietly = TRUE)) {
#'   future::plan(mizu_future, workers = 2)
#'   f <- future::future(Sys.getpid())
#'   future::value(f)
#'   future::plan(future::sequential)
#' }
#' }
#' @export
mizu_future <- function(expr, envir = parent.frame(), substitute = TRUE, lazy = FALSE,
                        seed = NULL, globals = TRUE, packages = NULL,
                        workers = future::availableCores(), ...) {
  if (substitute) expr <- substitute(expr)
  f <- .mizu_future_new(expr, envir = envir, lazy = lazy, seed = seed, globals = globals,
                        packages = packages, workers = workers, ...)
  if (!isTRUE(f$lazy)) f <- future::run(f)
  invisible(f)
}
class(mizu_future) <- c("mizu_future", "multiprocess", "future", "function")
# plan() evaluates a first future right away: the pool starts at plan() time.
attr(mizu_future, "init") <- TRUE
attr(mizu_future, "tweakable") <- "workers"

.mizu_future_new <- function(expr, envir, globals, packages, workers, ...) {
  gp <- future::getGlobalsAndPackages(expr, envir = envir, globals = globals)
  f <- future::MultiprocessFuture(expr = gp$expr, envir = envir, substitute = FALSE,
                                  globals = gp$globals,
                                  packages = unique(c(packages, gp$packages)), ...)
  f$workers <- .future_workers(workers)
  structure(f, class = c("MizuFuture", class(f)))
}

.future_workers <- function(workers) {
  if (is.function(workers)) workers <- workers()
  most <- .Call(wrap__pool_limits)[[1]]
  if (!is.numeric(workers) || length(workers) != 1L || is.na(workers) ||
      !is.finite(workers) || workers < 1 || workers > most) {
    stop(future::FutureError(sprintf(
      "mizu_future: `workers` must be a whole number in 1..%d, not %s", most,
      paste(format(workers), collapse = ", "))))
  }
  as.integer(workers)
}

# The plan's pool of `n` workers: the running one, or a new one (stopping one of another size).
.future_pool <- function(n) {
  p <- .fut$pool
  if (!is.null(p) && identical(.fut$n, n) && isTRUE(.Call(wrap__pool_info, p)[[3]])) return(p)
  .future_stop()
  p <- mizu_pool(n)
  .future_on_plan_change(p)
  .fut$pool <- p
  .fut$n <- n
  p
}

# Stops the plan's pool (or `pool`, if it is still the plan's): futures still running fail
# (FutureError when collected). The large globals shared for it are let go and their memory
# given back now, so that nothing of the plan's is left in /dev/shm.
.future_stop <- function(pool = .fut$pool) {
  if (!is.null(pool)) mizu_pool_stop(pool)
  if (!identical(pool, .fut$pool)) return(invisible())
  .fut$pool <- NULL
  .fut$n <- NULL
  rm(list = ls(.fut$active, all.names = TRUE), envir = .fut$active)
  .fut$n_active <- 0L
  if (!is.null(.fut$relay_dir)) unlink(.fut$relay_dir, recursive = TRUE)
  .fut$relay_dir <- NULL
  if (length(.fut$shared) || !is.null(.fut$wrapper_sent)) {
    .fut$shared <- list()
    .fut$wrapper <- NULL
    .fut$wrapper_sent <- NULL
    gc(verbose = FALSE)
    .Call(wrap__give_back_idle)
  }
  invisible()
}

# `future` 1.31 stops the cluster in its registry whenever plan() changes (and when a
# cluster plan starts another): the pool is entered there as a one-node "cluster" whose
# stopCluster() method stops it. (Newer `future` releases without that registry leave the
# pool to be stopped when R exits or by mizu_future_stop().)
.future_on_plan_change <- function(pool) {
  ns <- asNamespace("future")
  if (!exists("ClusterRegistry", envir = ns, inherits = FALSE)) return(invisible())
  registry <- get("ClusterRegistry", envir = ns)
  key <- sprintf("mizu-%d-%.0f", Sys.getpid(), .fut$launched)
  registry("start", workers = key, makeCluster = function(workers, ...) {
    structure(list(pool), class = c("mizu_future_cluster", "cluster"))
  })
  invisible()
}

#' @exportS3Method parallel::stopCluster
stopCluster.mizu_future_cluster <- function(cl) .future_stop(cl[[1L]])

#' Stop the pool of a `mizu_future` plan
#'
#' `plan()` switching to another backend stops the pool itself; this stops it without
#' changing the plan (the next future starts a new pool).
#'
#' @return `NULL`, invisibly.
#' @examples
#' mizu_future_stop()
#' @export
mizu_future_stop <- function() .future_stop()

# Large globals cross once: a vector (or data frame) of 1 MiB or more is copied into shared
# memory the first time a future uses it, and later futures using the same value (an
# identical() one: the same object is recognised by its address at once) get the shared
# copy. The last few are kept (and with them their originals) until the plan's pool stops.
.future_share <- function(x) {
  if (!.worth_sharing(x)) return(x)
  for (hit in .fut$shared) if (identical(hit[[1L]], x)) return(hit[[2L]])
  s <- mizu_share(x)
  .fut$shared <- c(list(list(x, s)), utils::head(.fut$shared, 3L))
  s
}

#' @exportS3Method future::run
run.MizuFuture <- function(future, ...) {
  if (!identical(future$state, "created")) {
    label <- if (is.null(future$label)) "<none>" else future$label
    stop(future::FutureError(sprintf("A future ('%s') can only be launched once.", label),
                             future = future))
  }
  pool <- .future_pool(future$workers)
  .future_make_room()
  wrapper <- .future_wrapper(future::getExpression(future, expr = .FUTURE_HOLE, mc.cores = 1L))
  g <- future$globals
  # (lapply() keeps the names and drops the FutureGlobals attributes, which hold environments.)
  globals <- if (length(g)) lapply(unclass(g), .future_share) else list()
  .fut$launched <- .fut$launched + 1
  future$mizu_key <- sprintf("%015.0f", .fut$launched)
  future$mizu_relay <- file.path(.future_relay_dir(), future$mizu_key)
  future$mizu_relay_at <- 0
  # Globals may hold environments (an R6 object, a closure's frame): like future's other
  # backends, they are sent as copies (the mark lets the submit check pass them).
  vars <- structure(list(expr = future$expr, globals = globals, relay = future$mizu_relay,
                         wrapper = wrapper), mizu_copy = TRUE)
  future$task <- .Call(.native_submit_expr, pool, .FUTURE_TASK, vars, environment())
  assign(future$mizu_key, future, envir = .fut$active)
  .fut$n_active <- .fut$n_active + 1L
  future$state <- "running"
  invisible(future)
}

# The wrapper as it travels: a key naming it and its serialization, in shared memory (so that
# it is copied there once, not with every future), both kept while it stays the same.
.future_wrapper <- function(w) {
  if (!identical(w, .fut$wrapper)) {
    # (Its own count: a key names one wrapper only, even if a launch fails after this.)
    .fut$wrappers <- .fut$wrappers + 1
    .fut$wrapper <- w
    .fut$wrapper_sent <- list(sprintf("%d-%.0f", Sys.getpid(), .fut$wrappers),
                              mizu_share(serialize(w, NULL, xdr = FALSE)))
  }
  .fut$wrapper_sent
}

# On the worker: the future's expression in its wrapper, unserialized once per wrapper.
.future_expression <- function(expr, wrapper) {
  if (!identical(wrapper[[1L]], .fut$worker_key)) {
    .fut$worker_wrapper <- unserialize(wrapper[[2L]])
    .fut$worker_key <- wrapper[[1L]]
  }
  # (Natively: substitute() would copy the whole wrapper for every future; see src/future.c.)
  .Call(.native_fill_hole, .fut$worker_wrapper, .FUTURE_HOLE, expr)
}

# Before a launch with the backlog full: collect the oldest launched future's result into it.
.future_make_room <- function() {
  if (.fut$n_active < .FUTURE_BACKLOG) return(invisible())
  f <- get(ls(.fut$active, sorted = TRUE)[[1L]], envir = .fut$active)
  tryCatch(future::result(f), FutureError = function(e) NULL)
  invisible()
}

# On the worker: the globals are bound in its global environment, as `future`'s cluster
# backends do (a global function defined at top level finds the other globals there), and
# whatever an earlier future left there is removed first. The future's expression records
# every condition for the caller to relay and lets it go on; messages and warnings stop
# here, so that the worker does not print them as well. Immediate conditions (`progressr`'s
# progress updates) are also appended to the file `relay`, which the caller reads while the
# future runs; they are marked relayed in the result, so that collecting does not relay them
# again.
.future_run <- function(expr, globals, relay = NULL, wrapper = NULL) {
  if (!is.null(wrapper)) expr <- .future_expression(expr, wrapper)
  g <- globalenv()
  rm(list = ls(g, all.names = TRUE), envir = g)
  if (length(globals)) list2env(globals, envir = g)
  on.exit(rm(list = intersect(names(globals), ls(g, all.names = TRUE)), envir = g))
  relayed <- FALSE
  r <- withCallingHandlers(eval(expr, g),
    immediateCondition = function(c) {
      if (!is.null(relay)) relayed <<- .relay_write(relay, c) || relayed
    },
    message = function(m) invokeRestart("muffleMessage"),
    warning = function(w) invokeRestart("muffleWarning"))
  if (relayed && inherits(r, "FutureResult")) {
    for (k in seq_along(r$conditions)) {
      if (inherits(r$conditions[[k]]$condition, "immediateCondition")) {
        r$conditions[[k]]$signaled <- 1L
      }
    }
  }
  r
}

# One relayed condition: a record (4-byte length, then R's serialization) appended to the
# relay file. The reader takes only whole records, so a record being written is read later.
.relay_write <- function(path, c) {
  bytes <- serialize(c, NULL, xdr = FALSE)
  con <- file(path, open = "ab")
  on.exit(close(con))
  writeBin(c(writeBin(length(bytes), raw(), size = 4L), bytes), con)
  TRUE
}

# The caller's side: signals the conditions a running future relayed since the last look,
# as `future`'s cluster backends do with those their workers send.
.relay_read <- function(future) {
  path <- future$mizu_relay
  if (is.null(path) || !file.exists(path)) return(invisible())
  size <- file.size(path)
  at <- future$mizu_relay_at
  if (is.na(size) || size <= at) return(invisible())
  con <- file(path, open = "rb")
  on.exit(close(con))
  seek(con, at)
  buf <- readBin(con, raw(), size - at)
  pos <- 0
  conds <- list()
  while (length(buf) - pos >= 4) {
    n <- readBin(buf[pos + 1:4], integer(), size = 4L)
    if (length(buf) - pos - 4 < n) break
    conds[[length(conds) + 1L]] <- unserialize(buf[pos + 4 + seq_len(n)])
    pos <- pos + 4 + n
  }
  future$mizu_relay_at <- at + pos
  for (c in conds) {
    if (inherits(c, "warning")) warning(c) else if (inherits(c, "message")) message(c)
    else signalCondition(c)
  }
  invisible()
}

# The directory of the plan's relay files (removed with the pool).
.future_relay_dir <- function() {
  d <- .fut$relay_dir
  if (is.null(d) || !dir.exists(d)) {
    d <- tempfile("mizu-future-")
    dir.create(d, mode = "0700")
    .fut$relay_dir <- d
  }
  d
}

#' @exportS3Method future::resolved
resolved.MizuFuture <- function(x, run = TRUE, ...) {
  if (is.null(x$result)) {
    if (identical(x$state, "created")) {
      if (!run) return(FALSE)
      future::run(x)
    }
    .relay_read(x)
    if (!.Call(wrap__task_done, x$task)) return(FALSE)
    tryCatch(future::result(x), FutureError = function(e) NULL)
  }
  NextMethod()
}

#' @exportS3Method future::result
result.MizuFuture <- function(future, ...) {
  r <- future$result
  if (!is.null(r)) {
    if (inherits(r, "FutureError")) stop(r)
    return(r)
  }
  if (identical(future$state, "created")) future::run(future)
  # Waits in slices, relaying what the future signals meanwhile (progress updates).
  repeat {
    o <- .Call(.native_collect, future$task, 0.1)
    .relay_read(future)
    if (o[[1L]] != 6L) break
  }
  if (!is.null(future$mizu_relay)) unlink(future$mizu_relay)
  if (!is.null(future$mizu_key) && exists(future$mizu_key, envir = .fut$active,
                                          inherits = FALSE)) {
    rm(list = future$mizu_key, envir = .fut$active)
    .fut$n_active <- .fut$n_active - 1L
  }
  v <- tryCatch(.value(o), error = function(e) e)
  if (inherits(v, "FutureResult")) {
    future$result <- v
    future$state <- "finished"
    return(v)
  }
  label <- if (is.null(future$label)) "<none>" else future$label
  why <- if (inherits(v, "mizu_error_worker_died")) {
    sprintf("the mizu worker (pid %s) running it died", format(v$pid))
  } else if (inherits(v, "condition")) {
    conditionMessage(v)
  } else {
    "its worker returned something other than a FutureResult"
  }
  ex <- future::FutureError(sprintf("Failed to evaluate %s ('%s'): %s", class(future)[[1L]],
                                    label, why), future = future)
  future$result <- ex
  future$state <- "failed"
  stop(ex)
}

#' @exportS3Method future::nbrOfWorkers
nbrOfWorkers.mizu_future <- function(evaluator) {
  .future_workers(eval(formals(evaluator)$workers, envir = baseenv()))
}

#' @exportS3Method future::nbrOfFreeWorkers
nbrOfFreeWorkers.mizu_future <- function(evaluator, background = FALSE, ...) {
  n <- nbrOfWorkers.mizu_future(evaluator)
  busy <- 0L
  for (k in ls(.fut$active)) {
    f <- get(k, envir = .fut$active)
    if (!.Call(wrap__task_done, f$task)) busy <- busy + 1L
  }
  max(0L, n - busy)
}
