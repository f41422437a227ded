# Ordered, chunked, seeded maps over a pool.

# The chunks of .chunk_plan() as ranges of positions (a cross-language map's).
.chunks <- function(n, workers, chunk_size) {
  p <- .chunk_plan(n, workers, chunk_size)
  # (`:` called by .mapply, not a closure per chunk: ~2 us each.)
  chunks <- .mapply(`:`, list(p$starts, p$starts + p$lens - 1L), NULL)
  attr(chunks, "apart") <- p$apart
  chunks
}

# The runtime's chunks (mizu_pool::chunks): rounds of one per worker, shrinking, as their
# first positions and lengths; `apart`: whether the first round goes out before the rest are
# encoded.
.chunk_plan <- function(n, workers, chunk_size) {
  p <- .Call(wrap__chunk_plan, as.double(n), as.double(workers),
             if (is.null(chunk_size)) 0 else as.double(chunk_size))
  list(starts = as.integer(p[[1L]]), lens = as.integer(p[[2L]]), apart = p[[3L]])
}

#' Map a function over a vector or list on a pool
#'
#' Applies `.f` to each element of `.x` on the pool's workers and returns the results in
#' input order. Elements travel in chunks (sized adaptively unless `.chunk_size` is given).
#' The first error, by position, stops the elements not started yet and is raised here with
#' its original class and message; its field `index` is the failing element's position.
#'
#' @param .pool A [mizu_pool()] (or [mizu_current_pool()] inside a task).
#' @param .x A vector or list.
#' @param .f A function, called as `.f(.x[[i]], ...)`. Its environment travels with it (a
#'   function defined at top level refers to the worker's global environment). It is sent once
#'   per map and each worker unserializes it once, so what it keeps in its environment lasts
#'   for the map on that worker, not beyond.
#' @param ... Further arguments to `.f`, the same for every element, passed as values as
#'   `lapply()` passes them (a call or a symbol is not evaluated).
#' @param .seed `NULL`, or a whole number: element `i` then runs with R's random number
#'   generator drawing from the stream of `(.seed, i)` (see [mizu_stream()]), so `runif()`,
#'   `rnorm()`, `sample()` give the same results for any number of workers and any chunking.
#'   The caller's and the workers' RNG state is left as it was.
#' @param .ptype `NULL` for a list, or a prototype (`double()`, `integer()`, `logical()`,
#'   `character()`, `complex()`, `raw()`): every result must then be one value of that type,
#'   and the result is a vector of that type. Past 4 KiB of results of a fixed-size type (all
#'   but `character()`), the workers write them straight into one vector in shared memory,
#'   which is returned as a view of it (see [mizu_is_view()]); no copy assembles it.
#' @param .progress Show a text progress bar.
#' @param .chunk_size Elements per task (`NULL`: adaptive).
#' @return A list (or a vector of `.ptype`) with the names of `.x`.
#' @examples
#' \donttest{
#' pool <- mizu_pool(2)
#' mizu_map(pool, 1:5, function(i, k) i * k, k = 10, .ptype = double())
#' mizu_map(pool, 1:3, function(i) runif(1), .seed = 42)
#' mizu_pool_stop(pool)
#' }
#' @export
mizu_map <- function(.pool, .x, .f, ..., .seed = NULL, .ptype = NULL, .progress = FALSE,
                     .chunk_size = NULL) {
  pool <- .pool
  info <- .Call(wrap__pool_info, pool)
  if (!is.null(.chunk_size) && (!is.numeric(.chunk_size) || length(.chunk_size) != 1L ||
                                is.na(.chunk_size) || .chunk_size < 1)) {
    stop("`.chunk_size` must be a positive whole number (or NULL)", call. = FALSE)
  }
  if (isTRUE(info[[4]])) {
    return(.xmap(pool, info, .x, .f, list(...), .check_seed(.seed), .progress, .chunk_size))
  }
  .f <- match.fun(.f)
  seed <- .check_seed(.seed)
  if (!is.null(.ptype) && !(is.atomic(.ptype) && length(.ptype) == 0L)) {
    stop("`.ptype` must be an empty atomic vector such as double() (or NULL)", call. = FALSE)
  }
  n <- length(.x)
  dots <- list(...)
  # A plain vector travels in slices (one block of values per chunk, to be taken apart with
  # `[[` as as.list() would): no list of n one-element vectors to build, check and encode.
  plain <- is.atomic(.x) && !is.null(.x) && is.null(oldClass(.x))
  xs <- if (is.list(.x) || plain) .x else as.list(.x)
  .check_sendable(dots, "argument ")
  .check_sendable(xs, "`.x` element ")
  workers <- if (info[[2]]) 2L else info[[1]]
  plan <- .chunk_plan(n, workers, if (!is.null(.chunk_size)) as.integer(.chunk_size))
  starts <- plan$starts
  nc <- length(starts)
  # Every chunk carries its own copy of `.f`; a closure R has not compiled yet would be
  # compiled by R's JIT in every chunk (a millisecond or more each, on the workers' time).
  if (nc > workers && typeof(.f) == "closure" && !.Call(wrap__is_compiled, .f)) {
    .f <- .compile_once(.f)
  }
  # Typed results past a view's size: the chunk tasks write them straight into one shared
  # output area, and the result is a view of it (no assembling copy here).
  out <- if (!is.null(.ptype)) .Call(wrap__out_new, pool, .ptype, n)
  spec <- if (!is.null(out)) out[[2L]]
  # `.f` is serialized once for all chunks (~40 us for a small compiled closure, per chunk
  # before), and a worker unserializes it once per map (see .chunk_function). A function of
  # the global environment R has not compiled, in a map of no more chunks than workers, goes
  # as itself instead, as in a one-chunk map: the compact encoding takes it (the caller
  # encodes it once, each worker makes it once and keeps it) and each worker runs its chunk
  # natively. (A compiled one is serialized: its byte code travels, and runs from the first
  # call.)
  as_itself <- nc <= workers && typeof(.f) == "closure" &&
    identical(environment(.f), globalenv()) && !.Call(wrap__is_compiled, .f)
  fun <- if (nc > 1L && !as_itself) {
    .maps$n <- .maps$n + 1
    list(bytes = serialize(.f, NULL, xdr = FALSE), map = c(Sys.getpid(), .maps$n))
  } else {
    .f
  }
  # A large extra argument goes to the workers once for the whole map, shared, instead of
  # with every chunk (after `.f` is serialized: that may have copied a shared vector its
  # environment holds out of shared memory).
  if (nc > 1L) dots <- lapply(dots, .share_if_large)
  # The global variables `.f` and the functions among the extra arguments use (found as
  # `future` finds them) go with the map once, shared when large; a worker binds them in its
  # global environment while it runs a chunk.
  globals <- .map_globals(c(list(.f), dots))
  # The packages the function uses (found as for mizu_submit()): the workers attach them.
  packages <- attr(globals, "packages")
  attr(globals, "packages") <- NULL
  if (length(globals)) {
    .check_sendable(globals, "global ")
    if (nc > 1L) globals <- lapply(globals, .share_if_large)
  }
  if (!is.null(names(xs))) xs <- unname(xs)
  msgs <- .Call(.native_chunk_msgs, starts, plan$lens, xs,
                list(fun, dots, seed, .ptype, spec, globals, packages))
  if (is.null(msgs)) {
    msgs <- .mapply(function(s, len) {
      m <- list("m", fun, dots, xs[s + seq_len(len) - 1L], seed, s, .ptype, spec, globals)
      if (is.null(packages)) m else c(m, list(packages))
    }, list(starts, plan$lens), NULL)
  }
  # With a CPU to spare for this session, the first chunk of each worker goes out before the
  # rest are encoded, and the workers start meanwhile; else all go at once (see
  # mizu_pool::chunks::first_round_apart).
  first <- if (isTRUE(plan$apart)) seq_len(min(workers, length(msgs)))
  tasks <- if (length(first)) {
    c(.submit_many(pool, msgs[first]), .submit_many(pool, msgs[-first]))
  } else {
    .submit_many(pool, msgs)
  }
  bar <- if (isTRUE(.progress) && n > 0L) utils::txtProgressBar(0, n, style = 3)
  on.exit({
    # Stop what has not started; abandon the rest (their slots free themselves).
    for (t in tasks) .Call(wrap__task_cancel, t)
    if (!is.null(bar)) close(bar)
  })
  parts <- vector("list", nc)
  done <- 0L
  nt <- length(tasks)
  k <- 1L
  while (k <= nt) {
    # The runtime decides how long to sleep (mizu_pool::Ahead): every result is wanted at
    # once, or, with a progress bar, streamed. Without one, the chunks' plain results are
    # collected natively up to the first other outcome (see mizu_collect_all()).
    o <- NULL
    if (is.null(bar)) {
      r <- .Call(.native_collect_values, tasks, k, Inf)
      got <- length(r[[1L]])
      if (got > 0L && is.null(spec)) parts[k:(k + got - 1L)] <- r[[1L]]
      k <- k + got
      if (r[[2L]] == 0L) break
      if (r[[2L]] == 3L) .signal_interrupt()
      if (r[[2L]] == 1L) o <- r[[3L]]
    }
    if (is.null(o)) {
      # (A final task needs no wait: the check here only spares copying the rest of the list.)
      if (!.Call(.native_task_done, tasks[[k]]) &&
          .Call(wrap__tasks_wait_ahead, tasks[k:nt], !is.null(bar), Inf) < 0L) {
        .signal_interrupt()
      }
      o <- .Call(.native_collect, tasks[[k]], Inf)
    }
    if (o[[1]] == 1L) {
      e <- .remote_condition(o[[2]])
      if (is.null(e$index)) e$index <- starts[[k]]
      stop(e)
    }
    part <- .value(o, index = starts[[k]])
    if (is.null(spec)) parts[[k]] <- part
    done <- done + plan$lens[[k]]
    if (!is.null(bar)) utils::setTxtProgressBar(bar, done)
    k <- k + 1L
  }
  out <- if (!is.null(spec)) {
    .Call(wrap__out_view, out[[1L]])
  } else if (is.null(.ptype)) {
    do.call(c, c(list(list()), parts))
  } else if (length(parts)) {
    unlist(parts, use.names = FALSE)
  } else {
    .ptype
  }
  names(out) <- names(.x)
  out
}

# The last closure mapped and its compiled copy (so that mapping the same function again does
# not compile it again; it stays referenced until another one is mapped).
.compiled <- new.env(parent = emptyenv())

.compile_once <- function(f) {
  if (!identical(f, .compiled$src)) {
    .compiled$cmp <- compiler::cmpfun(f)
    .compiled$src <- f
  }
  .compiled$cmp
}

# Checks that `r` (the result of element i) is one value of ptype's type; returns it as that
# type, without attributes.
.typed_value <- function(r, ptype, i) {
  if (length(r) != 1L || !is.atomic(r) || (typeof(r) != typeof(ptype) &&
      !(is.numeric(r) && typeof(ptype) == "double"))) {
    stop(sprintf("element %d: the result must be one %s value, not %s of length %d",
                 i, typeof(ptype), typeof(r), length(r)), call. = FALSE)
  }
  as.vector(r, typeof(ptype))
}

# Runs one chunk on a worker: results for elements `start`, `start + 1`, ... An error in an
# element reaches the worker's handlers (see .handlers_call) with .worker_state$element set
# to its position. With a seed, R's RNG is switched to mizu's streams for the chunk and element i
# draws from the stream of (seed, i); the worker's own RNG kind and state are put back after.
# With an output `spec`, typed results go into the caller's output area instead of back.
.run_chunk <- function(msg) {
  # `msg` is list("m", f, dots, xs, seed, start, ptype, spec, globals, packages), the last two
  # optional (see mizu_map()); taken apart here rather than passed as ten arguments (a
  # promise each).
  f <- msg[[2L]]
  dots <- msg[[3L]]
  xs <- msg[[4L]]
  seed <- msg[[5L]]
  start <- msg[[6L]]
  ptype <- msg[[7L]]
  spec <- msg[[8L]]
  globals <- if (length(msg) >= 9L) msg[[9L]]
  packages <- if (length(msg) >= 10L) msg[[10L]]
  if (!is.null(packages)) .Call(.native_attach_packages, packages)
  if (is.list(f)) f <- .chunk_function(f)
  if (length(globals)) {
    bound <- .bind_globals(globals)
    on.exit(.unbind_globals(bound), add = TRUE)
  }
  st <- .worker_state
  # The failing element's position reaches the worker's error handlers (.note_error, which
  # runs after this one) when an element fails (a binding per element would cost a tenth of
  # a 5 us element); the handler also sees errors `f` catches itself, so the position is
  # cleared after the loop. The common chunk — no seed, no type — runs as lapply does, in C
  # (src/shims.c), which passes `dots` on and establishes that handler itself.
  if (is.null(seed) && is.null(ptype)) {
    return(.Call(.native_each, f, xs, dots, start, st))
  }
  n <- length(xs)
  typed <- !is.null(ptype)
  out <- if (typed) vector(typeof(ptype), n) else vector("list", n)
  pt <- typeof(ptype)
  to_double <- pt == "double"
  if (!is.null(seed)) {
    saved <- .rng_switch()
    on.exit(.rng_restore(saved), add = TRUE)
  }
  # The extra arguments bound once: a do.call per element costs ~1 us more than the call.
  call_f <- if (length(dots)) {
    do.call(function(...) function(x) f(x, ...), dots, quote = TRUE)
  } else {
    f
  }
  j <- 0L
  withCallingHandlers(
    for (j in seq_len(n)) {
      if (!is.null(seed)) .Call(wrap__rng_enter, seed, start + j - 2L)
      r <- call_f(xs[[j]])
      if (typed) {
        # What .typed_value checks, inline: a call per element costs as much as the element.
        out[[j]] <- if (length(r) == 1L && is.atomic(r) &&
                        (typeof(r) == pt || (to_double && is.numeric(r)))) {
          r
        } else {
          .typed_value(r, ptype, start + j - 1L)
        }
      } else if (!is.null(r)) {
        out[[j]] <- r
      }
    },
    error = function(e) st$element <- start + j - 1L
  )
  st$element <- NULL
  if (!is.null(spec)) {
    .Call(wrap__out_write, spec, start, out)
    return(NULL)
  }
  out
}

# The values of the global variables function `f` (or the functions in the list `f`) uses:
# names `codetools::findGlobals()` finds in the function (and, recursively, in the global
# functions it calls) that resolve, from the function's environment, to the global
# environment — which R's serialization does not carry (an enclosing function's environment
# travels with the closure). (C, in src/globals.c.)
.map_globals <- function(f) .Call(.native_function_globals, f)

# codetools::findGlobals(f), found once per function code (body and formals) and remembered
# for the next maps of it: a function written inline in a loop is a new closure each time,
# with the same code (src/globals.c looks there first and calls this on a miss). Only the
# code is kept, never an environment (which would keep its variables alive).
.free_names <- function(f) {
  key <- list(body(f), formals(f))
  i <- .Call(.native_find_identical, .maps$globals, key)
  if (i) return(.maps$globals[[i]][[2L]])
  nm <- codetools::findGlobals(f)
  .maps$globals <- c(list(list(key, nm)), utils::head(.maps$globals, 63L))
  nm
}

# Binds a map's globals (for a chunk) or a task's in this worker's global environment: what it
# replaced, to put back after (chunks of nested maps run inside other chunks). Natively, in
# src/globals.c.
.bind_globals <- function(globals) .Call(.native_bind_globals, globals)

.unbind_globals <- function(bound) .Call(.native_unbind_globals, bound)

# Maps made by this process (numbers them for .chunk_function).
.maps <- new.env(parent = emptyenv())
.maps$n <- 0
.maps$globals <- list()
.maps$exprs <- list()

# The function of a map's chunks, sent serialized with the map's number (the sending
# process's pid and its count of maps): unserialized by the map's first chunk on this worker
# and kept for its later ones, so that what the function keeps in its environment lasts for
# the map, never into another map (even of the same function). The bytes are compared too (a
# private copy is kept, so that no view of the caller's memory is held): a reused pid can
# never run another map's function.
.chunk_function <- function(sent) {
  st <- .worker_state
  if (!identical(sent$map, st$chunk_map) || !identical(sent$bytes, st$chunk_bytes)) {
    st$chunk_fun <- unserialize(sent$bytes)
    st$chunk_bytes <- c(sent$bytes)
    st$chunk_map <- sent$map
  }
  st$chunk_fun
}

# mizu_map() over a pool of Python workers: `.f` is a mizu_call() (or a function's name);
# elements travel in chunks (as for R workers), each appended to the call's arguments, element
# i under the stream (seed, i - 1).
.xmap <- function(pool, info, .x, .f, dots, seed, progress, chunk_size) {
  if (is.character(.f) && length(.f) == 1L) .f <- mizu_call(.f)
  if (!inherits(.f, "mizu_call")) {
    stop("a pool of Python workers maps a mizu_call(), not an R function", call. = FALSE)
  }
  if (.f$source) stop("mizu_map() needs a mizu_call() that names a function", call. = FALSE)
  xs <- if (is.list(.x)) .x else as.list(.x)
  workers <- if (info[[2]]) 2L else info[[1]]
  chunks <- .chunks(length(xs), workers, if (!is.null(chunk_size)) as.integer(chunk_size))
  tasks <- vector("list", length(chunks))
  on.exit(for (t in tasks) if (!is.null(t)) .Call(wrap__task_cancel, t))
  for (k in seq_along(chunks)) {
    ix <- chunks[[k]]
    t <- .Call(wrap__pool_submit_xchunk, pool, .f, dots, xs[ix], seed, ix[[1]] - 1)
    if (is.character(t)) .raise_failure(t)
    tasks[[k]] <- t
  }
  n <- length(xs)
  bar <- if (isTRUE(progress) && n > 0L) utils::txtProgressBar(0, n, style = 3)
  out <- vector("list", n)
  for (k in seq_along(chunks)) {
    ix <- chunks[[k]]
    o <- .Call(.native_collect, tasks[[k]], Inf)
    # The failing element's position (the chunk's first when the chunk as a whole failed).
    at <- if (o[[1]] == 1L && is.numeric(o[[2]]$element)) o[[2]]$element + 1 else ix[[1]]
    part <- .value(o, index = at)
    for (j in seq_along(ix)) if (!is.null(part[[j]])) out[[ix[[j]]]] <- part[[j]]
    if (!is.null(bar)) utils::setTxtProgressBar(bar, ix[[length(ix)]])
  }
  if (!is.null(bar)) close(bar)
  names(out) <- names(.x)
  out
}

# `x` shared (see mizu_share) when it is a vector or data frame of 1 MiB or more not shared
# already; else `x`.
# Environments and external pointers fail here, naming where they sit (see src/pool.rs).
.check_sendable <- function(x, what) {
  f <- .Call(wrap__check_portable, x, what)
  if (!is.null(f)) .raise_failure(f)
}

# Whether `x` is worth sharing once: a vector or data frame of 1 MiB or more, not shared yet.
.worth_sharing <- function(x) {
  # (A vector of fewer than 2^16 numbers is under 1 MiB: no need to ask object.size(), ~8 us.)
  if (is.atomic(x) && !is.character(x) && length(x) < 65536L) return(FALSE)
  if (!(is.atomic(x) || is.data.frame(x)) || utils::object.size(x) < 2^20) return(FALSE)
  probe <- if (is.data.frame(x)) x[[1L]] else x
  is.null(probe) || !mizu_is_shared(probe)
}

.share_if_large <- function(x) if (.worth_sharing(x)) mizu_share(x) else x
