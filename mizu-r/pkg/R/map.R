# Ordered, chunked, seeded maps over a pool.

# Guided chunk sizes: large first, smaller towards the end, so workers finish together.
.chunks <- function(n, workers, chunk_size) {
  if (n == 0L) return(list())
  if (!is.null(chunk_size)) {
    starts <- seq.int(1L, n, by = chunk_size)
    return(lapply(starts, function(s) s:min(n, s + chunk_size - 1L)))
  }
  out <- list()
  s <- 1L
  while (s <= n) {
    k <- max(1L, as.integer(ceiling((n - s + 1L) / (4L * workers))))
    out[[length(out) + 1L]] <- s:min(n, s + k - 1L)
    s <- s + k
  }
  out
}

#' Map a function over a vector or list on a pool
#'
#' Applies `.f` to each element of `.x` on the pool's workers and returns the results in
#' input order. Elements travel in chunks (sized adaptively unless `.chunk_size` is given).
#' The first error, by position, stops the elements not started yet and is raised here with
#' its original class and message; its field `index` is the failing element's position.
#'
#' @param pool A [mizu_pool()] (or [mizu_current_pool()] inside a task).
#' @param .x A vector or list.
#' @param .f A function, called as `.f(.x[[i]], ...)`. Its environment travels with it (a
#'   function defined at top level refers to the worker's global environment).
#' @param ... Further arguments to `.f`, the same for every element.
#' @param .seed `NULL`, or a whole number: element `i` then runs with R's random number
#'   generator drawing from the stream of `(.seed, i)` (see [mizu_stream()]), so `runif()`,
#'   `rnorm()`, `sample()` give the same results for any number of workers and any chunking.
#'   The caller's and the workers' RNG state is left as it was.
#' @param .ptype `NULL` for a list, or a prototype (`double()`, `integer()`, `logical()`,
#'   `character()`, `complex()`, `raw()`): every result must then be one value of that type,
#'   and the result is a vector of that type.
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
mizu_map <- function(pool, .x, .f, ..., .seed = NULL, .ptype = NULL, .progress = FALSE,
                     .chunk_size = NULL) {
  .check_pool(pool)
  .f <- match.fun(.f)
  seed <- .check_seed(.seed)
  if (!is.null(.ptype) && !(is.atomic(.ptype) && length(.ptype) == 0L)) {
    stop("`.ptype` must be an empty atomic vector such as double() (or NULL)", call. = FALSE)
  }
  if (!is.null(.chunk_size) && (!is.numeric(.chunk_size) || length(.chunk_size) != 1L ||
                                is.na(.chunk_size) || .chunk_size < 1)) {
    stop("`.chunk_size` must be a positive whole number (or NULL)", call. = FALSE)
  }
  n <- length(.x)
  workers <- if (pool$nested || is.na(pool$n_workers)) 2L else pool$n_workers
  chunks <- .chunks(n, workers, if (!is.null(.chunk_size)) as.integer(.chunk_size))
  dots <- list(...)
  xs <- if (is.list(.x)) .x else as.list(.x)
  msgs <- lapply(chunks, function(ix) {
    list("m", .f, dots, unname(xs[ix]), seed, ix[[1]], .ptype)
  })
  tasks <- .submit_many(pool, msgs)
  bar <- if (isTRUE(.progress) && n > 0L) utils::txtProgressBar(0, n, style = 3)
  on.exit({
    # Stop what has not started; abandon the rest (their slots free themselves).
    for (t in tasks) if (t$state == "pending") mizu_cancel(t)
    if (!is.null(bar)) close(bar)
  })
  parts <- vector("list", length(chunks))
  done <- 0L
  for (k in seq_along(tasks)) {
    t <- tasks[[k]]
    .settle(t, .Call(wrap__task_collect, t$ptr, Inf))
    if (t$state == "failed") {
      e <- t$error
      if (is.null(e$index)) e$index <- chunks[[k]][[1]]
      stop(e)
    }
    parts[[k]] <- t$value
    done <- done + length(chunks[[k]])
    if (!is.null(bar)) utils::setTxtProgressBar(bar, done)
  }
  out <- if (is.null(.ptype)) {
    do.call(c, c(list(list()), parts))
  } else if (length(parts)) {
    unlist(parts, use.names = FALSE)
  } else {
    .ptype
  }
  names(out) <- names(.x)
  out
}

# Runs one chunk on a worker: results for elements `start`, `start + 1`, ...
.run_chunk <- function(f, dots, xs, seed, start, ptype) {
  n <- length(xs)
  out <- if (is.null(ptype)) vector("list", n) else vector(typeof(ptype), n)
  for (j in seq_len(n)) {
    i <- start + j - 1L
    call_f <- function() .mizu_user_code(function() do.call(f, c(list(xs[[j]]), dots)))
    r <- withCallingHandlers(
      if (is.null(seed)) call_f() else .with_stream(seed, i - 1, call_f),
      error = function(e) .mark_element(i)
    )
    if (is.null(ptype)) {
      if (!is.null(r)) out[[j]] <- r
    } else {
      if (length(r) != 1L || !is.atomic(r) || (typeof(r) != typeof(ptype) &&
          !(is.numeric(r) && is.numeric(ptype) && typeof(ptype) == "double"))) {
        .mark_element(i)
        stop(sprintf("element %d: the result must be one %s value, not %s of length %d",
                     i, typeof(ptype), typeof(r), length(r)), call. = FALSE)
      }
      out[[j]] <- r
    }
  }
  out
}

# Remembers which element failed (read by the worker's error handler).
.mark_element <- function(i) {
  .worker_state$element <- i
}
