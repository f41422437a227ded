# mizu_future as a `future` backend: the behaviours future.tests checks of a backend, then
# future.apply, furrr and progressr on it, worker death, plan switching and nesting under a
# cluster plan. Every future runs in real worker processes.

library(future)

worker_pids <- function() {
  p <- mizu:::.fut$pool
  if (is.null(p)) integer() else mizu_pool_status(p)$pid
}

plan(mizu_future, workers = 2)

test_that("plan() starts a pool of the requested size and nbrOfWorkers() reports it", {
  plan(mizu_future, workers = 2)
  expect_equal(nbrOfWorkers(), 2)
  expect_length(worker_pids(), 2L)
  expect_true(nbrOfFreeWorkers() %in% 0:2)
  expect_true(inherits(plan("next"), "mizu_future"))
})

test_that("a future's expression goes into future's wrapper as substitute() would put it", {
  ns <- asNamespace("mizu")
  w <- getExpression(future(1, lazy = TRUE), expr = ns$.FUTURE_HOLE, mc.cores = 1L)
  kept <- serialize(w, NULL)
  for (e in list(quote(1), quote({ x <- 2; x + y }), quote(f(a, b = g(.mizu_other))), NULL)) {
    expect_identical(.Call(ns$.native_fill_hole, w, ns$.FUTURE_HOLE, e),
                     do.call(substitute, list(w, list(.mizu_future_expr = e))))
  }
  # The wrapper the worker keeps is left as it was (the filled one shares its other calls).
  expect_identical(serialize(w, NULL), kept)
  expect_error(.Call(ns$.native_fill_hole, w, "x", 1), "not a symbol")
})

test_that("future() and value() run in a worker process", {
  f <- future(Sys.getpid())
  expect_s3_class(f, "MizuFuture")
  pid <- value(f)
  expect_true(pid %in% worker_pids())
  expect_false(pid == Sys.getpid())
  expect_equal(value(future(6 * 7)), 42)
  expect_null(value(future(NULL)))
})

test_that("futures' results are intact when R collects garbage at every allocation", {
  # A result (a classed list with times and nested lists) is read through R's serialization:
  # any moment it spends unprotected while R allocates is found by gctorture.
  invisible(value(future(1)))
  fs <- lapply(1:6, function(i) future(list(i, letters[[i]])))
  gctorture(TRUE)
  vs <- tryCatch(value(fs), error = function(e) e)
  gctorture(FALSE)
  expect_false(inherits(vs, "error"), info = if (inherits(vs, "error")) conditionMessage(vs))
  expect_identical(vs, lapply(1:6, function(i) list(i, letters[[i]])))
})

test_that("resolved() does not block and turns TRUE once the future is done", {
  f <- future({ Sys.sleep(1); 1 })
  t0 <- proc.time()[[3]]
  r <- resolved(f)
  expect_lt(proc.time()[[3]] - t0, 0.5)   # hang guard: it returned before the future ended
  expect_false(r)
  expect_equal(value(f), 1)
  expect_true(resolved(f))
})

test_that("nbrOfFreeWorkers() counts futures still running", {
  fs <- lapply(1:2, function(i) future({ Sys.sleep(1); i }))
  expect_equal(nbrOfFreeWorkers(), 0)
  expect_equal(unlist(value(fs)), 1:2)
  expect_equal(nbrOfFreeWorkers(), 2)
})

test_that("%<-% assigns a future's value, futureAssign() and futureOf() work", {
  x %<-% { 2 * 21 }
  expect_equal(x, 42)
  futureAssign("y", { 10 + 1 })
  expect_equal(y, 11)
  z %<-% { Sys.getpid() }
  f <- futureOf(z)
  expect_s3_class(f, "MizuFuture")
  expect_true(z %in% worker_pids())
})

test_that("lazy futures do not run until their value is asked for", {
  marker <- tempfile()
  f <- future({ file.create(marker); "ran" }, lazy = TRUE)
  Sys.sleep(0.3)
  expect_false(file.exists(marker))
  expect_equal(value(f), "ran")
  expect_true(file.exists(marker))
  unlink(marker)
})

test_that("globals are found: variables, functions calling other globals, formulas", {
  a <- 2
  helper <- function(v) v * a
  caller <- function(v) helper(v) + 1
  expect_equal(value(future(caller(10))), 21)
  df <- data.frame(x = 1:10, y = 2 * (1:10) + 3)
  fml <- y ~ x
  fit <- value(future(coef(lm(fml, data = df))))
  expect_equal(unname(fit), c(3, 2), tolerance = 1e-8)
  # A global defined at top level (the worker's global environment) finds its own globals.
  g <- globalenv()
  assign("mizu_test_top", function() mizu_test_k * 2, envir = g)
  assign("mizu_test_k", 21, envir = g)
  on.exit(rm(list = c("mizu_test_top", "mizu_test_k"), envir = g))
  expect_equal(value(future(mizu_test_top(), envir = g)), 42)
  # A global modified after the future was created keeps its value at creation.
  b <- 1
  f <- future(b + 1)
  b <- 100
  expect_equal(value(f), 2)
  # Globals in `...`.
  h <- function(...) value(future(sum(...)))
  expect_equal(h(1, 2, 3), 6)
})

test_that("the workers do not keep globals from one future to the next", {
  value(future({ assign("leftover", 1, envir = globalenv()); 1 }))
  expect_false(any(unlist(value(lapply(1:4, function(i) {
    future(exists("leftover", envir = globalenv()))
  })))))
})

test_that("packages the future needs are loaded on the worker", {
  f <- future(tools::toTitleCase("hello world"))
  expect_equal(value(f), "Hello World")
  f <- future({ codetools::findGlobals(function(x) x + y) })
  expect_true("y" %in% value(f))
  f <- future("stats4" %in% loadedNamespaces(), packages = "stats4")
  expect_true(value(f))
})

test_that("messages, warnings and output are relayed once each, in order", {
  f <- future({
    cat("line 1\n")
    message("msg A")
    warning("warn B")
    print(1:3)
    message("msg C")
    "done"
  })
  seen <- character()
  out <- capture.output({
    v <- withCallingHandlers(value(f),
      message = function(m) { seen <<- c(seen, paste("M", trimws(conditionMessage(m)))); invokeRestart("muffleMessage") },
      warning = function(w) { seen <<- c(seen, paste("W", conditionMessage(w))); invokeRestart("muffleWarning") })
  })
  expect_equal(v, "done")
  expect_equal(seen, c("M msg A", "W warn B", "M msg C"))
  expect_equal(out, c("line 1", "[1] 1 2 3"))
  # Collected once, relayed once: asking again relays again (as future does), the value
  # itself is the same.
  capture.output(v2 <- suppressMessages(suppressWarnings(value(f))))
  expect_equal(v2, "done")
})

test_that("stdout = FALSE drops output; conditions = NULL drops conditions", {
  f <- future({ cat("hidden\n"); 1 }, stdout = FALSE)
  expect_equal(capture.output(v <- value(f)), character())
  f <- future({ message("m"); 2 }, conditions = NULL)
  expect_silent(v <- value(f))
  expect_equal(v, 2)
})

test_that("futures of different settings, interleaved on one worker, each run with their own", {
  # Each worker keeps the last wrapper `future` put around a future's expression; futures that
  # differ in output, conditions and seed alternate on one worker here.
  plan(mizu_future, workers = 1)
  on.exit(plan(mizu_future, workers = 2))
  x <- 5
  for (round in 1:2) {
    expect_equal(capture.output(v <- value(future({ cat("shown\n"); x + 1 }))), "shown")
    expect_equal(v, 6)
    expect_equal(capture.output(v <- value(future({ cat("hidden\n"); x + 2 }, stdout = FALSE))),
                 character())
    expect_equal(v, 7)
    expect_silent(v <- value(future({ message("m"); x + 3 }, conditions = NULL)))
    expect_equal(v, 8)
    expect_identical(value(future(runif(2), seed = 42L)), {
      plan(sequential); r <- value(future(runif(2), seed = 42L))
      plan(mizu_future, workers = 1); r
    })
    expect_message(value(future({ message("relayed"); 1 })), "relayed")
  }
})

test_that("errors keep their classes, message and call", {
  f <- future({
    stop(structure(class = c("myError", "error", "condition"),
                   list(message = "boom", call = quote(my_fun(1)))))
  })
  e <- tryCatch(value(f), error = identity)
  expect_s3_class(e, "myError")
  expect_equal(conditionMessage(e), "boom")
  expect_equal(conditionCall(e), quote(my_fun(1)))
  expect_error(value(future(sqrt("a"))), "non-numeric")
  # A future's error does not break the pool.
  expect_equal(value(future(1)), 1)
})

test_that("early signalling raises a future's error from resolved()", {
  f <- future(stop("early"), earlySignal = TRUE)
  expect_error(while (!resolved(f)) Sys.sleep(0.01), "early")
})

test_that("seeded futures give the numbers plan(sequential) gives", {
  draw <- function() {
    fs <- lapply(1:6, function(i) future(c(runif(2), rnorm(1)), seed = TRUE))
    value(fs)
  }
  set.seed(123)
  on_mizu <- draw()
  plan(sequential)
  set.seed(123)
  on_seq <- draw()
  plan(mizu_future, workers = 2)
  expect_identical(on_mizu, on_seq)
  expect_identical(value(future(runif(3), seed = 42L)),
                   { plan(sequential); v <- value(future(runif(3), seed = 42L))
                     plan(mizu_future, workers = 2); v })
})

test_that("nested futures run (sequentially, by default) inside a worker", {
  f <- future({
    inner <- future::future(Sys.getpid())
    c(outer = Sys.getpid(), inner = future::value(inner))
  })
  v <- value(f)
  expect_true(v[["outer"]] %in% worker_pids())
  expect_equal(v[["inner"]], v[["outer"]])
})

test_that("large globals cross once, as shared memory", {
  big <- runif(2^18)   # 2 MiB
  before <- .Call(mizu:::wrap__payload_bytes_written)
  v <- value(lapply(1:6, function(i) future(sum(big) + i)))
  crossed <- .Call(mizu:::wrap__payload_bytes_written) - before
  expect_equal(unlist(v), sum(big) + 1:6)
  expect_lt(crossed, 2 * 8 * 2^18)   # the vector once (not six times), plus small payloads
})

test_that("a worker killed mid-future gives a FutureError, and the plan serves on", {
  f <- future({ tools::pskill(Sys.getpid(), tools::SIGKILL); Sys.sleep(10) })
  e <- tryCatch(value(f), error = identity)
  expect_s3_class(e, "FutureError")
  expect_match(conditionMessage(e), "died")
  expect_true(resolved(f))
  expect_equal(value(future(1 + 1)), 2)
  expect_length(worker_pids(), 2L)
})

test_that("future.apply: future_lapply and future_sapply with future.seed", {
  library(future.apply)
  expect_equal(future_lapply(1:5, function(i) i^2), as.list((1:5)^2))
  expect_equal(future_sapply(1:200, function(i) i * 2), (1:200) * 2)
  expect_equal(future_lapply(1:5, function(i) i, future.chunk.size = 1), as.list(1:5))
  on_mizu <- future_sapply(1:20, function(i) runif(1), future.seed = 42)
  plan(sequential)
  on_seq <- future_sapply(1:20, function(i) runif(1), future.seed = 42)
  plan(mizu_future, workers = 2)
  expect_identical(on_mizu, on_seq)
  expect_error(future_lapply(1:3, function(i) if (i == 2) stop("bad ", i) else i), "bad 2")
})

test_that("furrr: future_map with seeds as plan(sequential)", {
  suppressPackageStartupMessages(library(furrr))
  expect_equal(future_map_dbl(1:10, ~ .x * 3), (1:10) * 3)
  opts <- furrr_options(seed = 7)
  on_mizu <- future_map(1:10, ~ rnorm(2), .options = opts)
  plan(sequential)
  on_seq <- future_map(1:10, ~ rnorm(2), .options = opts)
  plan(mizu_future, workers = 2)
  expect_identical(on_mizu, on_seq)
})

test_that("progressr: every progress update reaches the caller", {
  library(progressr)
  steps <- integer()
  counter <- function(...) {
    progressr::make_progression_handler("mizu_test", reporter = list(
      update = function(config, state, progression, ...) steps <<- c(steps, state$step)
    ), intrusiveness = 0, interval = 0, enable = TRUE, ...)
  }
  with_progress({
    p <- progressor(6)
    r <- future.apply::future_lapply(1:6, function(i) { p(); i }, future.chunk.size = 1)
  }, handlers = counter, enable = TRUE)
  expect_equal(unlist(r), 1:6)
  expect_equal(max(steps), 6)
  # Live: an update made while the future still runs reaches the caller before it ends.
  steps <- integer()
  seen_while_running <- NA
  with_progress({
    p <- progressor(2)
    f <- future({ p(); Sys.sleep(3); p(); "done" })
    deadline <- proc.time()[[3]] + 60   # hang guard
    while (!length(steps) && proc.time()[[3]] < deadline) {
      done <- resolved(f)
      Sys.sleep(0.02)
    }
    seen_while_running <- !done
    v <- value(f)
  }, handlers = counter, enable = TRUE)
  expect_equal(v, "done")
  expect_true(seen_while_running)
  expect_equal(max(steps), 2)
})

test_that("switching plan() stops the pool and leaves nothing in /dev/shm", {
  plan(mizu_future, workers = 2)
  invisible(value(future(1)))
  pids <- worker_pids()
  expect_length(pids, 2L)
  plan(sequential)
  expect_null(mizu:::.fut$pool)
  alive <- vapply(pids, function(p) tools::pskill(p, 0L), TRUE)
  deadline <- proc.time()[[3]] + 10
  while (any(alive) && proc.time()[[3]] < deadline) {
    Sys.sleep(0.05)
    alive <- vapply(pids, function(p) tools::pskill(p, 0L), TRUE)
  }
  expect_false(any(alive))
  gc()
  expect_equal(setdiff(shm_names(), shm_before), character())
  # Another size restarts it; mizu_future_stop() stops it without changing the plan.
  plan(mizu_future, workers = 1)
  expect_length(worker_pids(), 1L)
  mizu_future_stop()
  expect_null(mizu:::.fut$pool)
  expect_equal(value(future(3)), 3)
  expect_length(worker_pids(), 1L)
  plan(mizu_future, workers = 2)
})

test_that("nested under a cluster plan, each node runs its own mizu pool", {
  plan(list(tweak(cluster, workers = c("localhost", "localhost")),
            tweak(mizu_future, workers = 2)))
  on.exit(plan(mizu_future, workers = 2))
  fs <- lapply(1:2, function(i) future({
    node <- Sys.getpid()
    inner <- future.apply::future_sapply(1:4, function(j) Sys.getpid())
    list(node = node, inner = inner, plan = inherits(future::plan("next"), "mizu_future"))
  }))
  v <- value(fs)
  for (r in v) {
    expect_true(r$plan)
    expect_false(any(r$inner == r$node))
    expect_false(any(r$inner == Sys.getpid()))
  }
  expect_false(v[[1]]$node == Sys.getpid())
})

plan(sequential)

test_that("globals given explicitly, futureCall(), %globals%, %seed%, %lazy% and labels", {
  plan(mizu_future, workers = 2)
  a <- 1
  b <- 2
  expect_equal(value(future(a + b, globals = list(a = 10, b = 20))), 30)
  expect_equal(value(future(a + b, globals = c("a", "b"))), 3)
  expect_error(value(future(a + b, globals = FALSE)), "not found")
  expect_equal(value(futureCall(function(x, y) x * y, args = list(x = 6, y = 7))), 42)
  y %<-% { a * 100 } %globals% list(a = 5)
  expect_equal(y, 500)
  s1 %<-% { runif(2) } %seed% 99
  s2 %<-% { runif(2) } %seed% 99
  expect_identical(s1, s2)
  f <- future({ 1 }, label = "my-label")
  expect_equal(f$label, "my-label")
  expect_equal(value(f), 1)
  out <- capture.output(print(f))
  expect_true(any(grepl("MizuFuture", out)))
  z %<-% { 3 } %lazy% TRUE
  expect_equal(z, 3)
})

test_that("value() and resolved() of lists, environments and listenvs of futures", {
  plan(mizu_future, workers = 2)
  fs <- lapply(1:4, function(i) future(i * 10))
  expect_equal(unlist(value(fs)), c(10, 20, 30, 40))
  expect_true(all(resolved(fs)))
  env <- new.env()
  env$a <- future(1)
  env$b <- future(2)
  expect_equal(mget(c("a", "b"), envir = value(env)), list(a = 1, b = 2))
  x <- listenv::listenv()
  for (i in 1:3) x[[i]] %<-% { i^2 }
  expect_equal(unlist(as.list(x)), c(1, 4, 9))
  res <- resolve(lapply(1:3, function(i) future(i)))
  expect_true(all(resolved(res)))
})

test_that("an unseeded future that uses the RNG gets future's warning, as with other backends", {
  plan(mizu_future, workers = 2)
  f <- future(runif(1))
  expect_warning(value(f), class = "RngFutureWarning")
})

plan(sequential)
