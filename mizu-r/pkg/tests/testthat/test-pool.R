test_that("a task sees only its bindings and the worker's global environment", {
  with_pool(1, function(pool) {
    expect_equal(mizu_collect(mizu_submit(pool, x + y, x = 40, y = 2)), 42)
    secret <- "caller's"
    t <- mizu_submit(pool, exists("secret"))
    expect_false(mizu_collect(t))
    expect_equal(mizu_collect(mizu_submit(pool, environmentName(parent.env(environment())))),
                 "R_GlobalEnv")
    f <- function(v) v * 3
    expect_equal(mizu_collect(mizu_submit(pool, f(7), f = f)), 21)
    expect_error(mizu_submit(pool, x, 1), "must be named")
  })
})

test_that("mizu_submit evaluates its arguments as a call would, compiled or not", {
  with_pool(1, function(pool) {
    seen <- character(0)
    note <- function(v, tag) {
      seen <<- c(seen, tag)
      v
    }
    t <- mizu_submit(note(pool, "pool"), x + y, x = note(1, "x"), y = note(2, "y"))
    expect_identical(seen, c("pool", "x", "y"))
    expect_equal(mizu_collect(t), 3)
    expect_error(mizu_submit(pool, x, x = stop("from the argument")), "from the argument")
    expect_error(mizu_submit(pool, x, x = ), "`x` in `...` is missing")
    fwd <- function(...) mizu_submit(pool, a * b, ...)
    expect_equal(mizu_collect(fwd(a = 3, b = 4)), 12)
    expect_equal(mizu_collect(do.call(mizu_submit, list(pool, quote(k + 1), k = 1))), 2)
    # Byte-compiled callers pass constants as values rather than promises.
    compiled <- compiler::cmpfun(function() mizu_collect(mizu_submit(pool, 5L, k = 2)))
    expect_identical(compiled(), 5L)
    old <- compiler::enableJIT(0)
    on.exit(compiler::enableJIT(old))
    plain <- function() mizu_collect(mizu_submit(pool, k * 2, k = 21))
    expect_identical(plain(), 42)
  })
})

test_that("bindings of every small kind, odd names and none reach the expression", {
  # Small messages take the worker's direct path (bindings decoded straight into the task's
  # environment); these are the cases it must handle exactly as the general path does.
  with_pool(1, function(pool) {
    run <- function(...) mizu_collect(mizu_submit(pool, ...))
    expect_identical(run(ls(environment())), character(0))
    expect_identical(run(identical(parent.env(environment()), globalenv())), TRUE)
    vals <- list(n = NULL, l = c(TRUE, NA), i = 1:3, d = c(1.5, NA), z = 1i, s = c("a", NA),
                 r = as.raw(1:3), k = list(1L, "x", list(NULL)), nm = c(a = 1, b = 2),
                 q = quote(f(x, y = 2)), sym = as.name("zz"))
    # mizu_submit(pool, mget(...), n = quote(NULL), ...): calls and symbols stay values.
    cl <- as.call(c(list(quote(mizu_submit), pool, quote(mget(ls(environment()), environment()))),
                    lapply(vals, function(v) call("quote", v))))
    got <- mizu_collect(eval(cl))
    expect_identical(got[order(names(got))], vals[order(names(vals))])
    expect_identical(run(c(1, c), c = 3), c(1, 3))  # a binding named like a function
    utf8 <- do.call(mizu_submit, c(list(pool, quote(list(`a b`, get("caf\u00e9")))),
                                   setNames(list(1L, "\u00e9"), c("a b", "caf\u00e9"))))
    expect_identical(mizu_collect(utf8), list(1L, "\u00e9"))
    expect_identical(run(a, a = 1, a = 2), 2)       # the last of a repeated name wins
    e <- tryCatch(run(stop(structure(class = c("my_error", "error", "condition"),
                                    list(message = paste("boom", x), call = NULL))), x = 7),
                  my_error = function(e) conditionMessage(e))
    expect_identical(e, "boom 7")
    # More bindings than the direct path keeps (16) take the general one.
    many <- setNames(as.list(1:40), paste0("v", 1:40))
    expect_identical(mizu_collect(do.call(mizu_submit, c(list(pool, quote(v1 + v40)), many))),
                     41L)
    # The worker keeps the symbols of the last names it decoded: more names than it keeps,
    # in turns, and names that differ only in encoding, each find their own binding.
    for (round in 1:2) for (k in c(1:24, 3:1)) {
      nm <- paste0("w", k)
      t <- do.call(mizu_submit, c(list(pool, as.name(nm)), setNames(list(k * 10L), nm)))
      expect_identical(mizu_collect(t), k * 10L)
    }
    latin1 <- iconv("caf\u00e9", "UTF-8", "latin1")
    for (nm in c("caf\u00e9", latin1, "cafe")) {
      t <- do.call(mizu_submit, c(list(pool, quote(ls(environment()))), setNames(list(1L), nm)))
      expect_identical(enc2utf8(mizu_collect(t)), enc2utf8(nm))
    }
    # A binding whose value fails is an error of the submitting call, as in R.
    expect_error(mizu_submit(pool, x, x = stop("no value")), "no value")
    expect_identical(run(x, x = 5L), 5L)
  })
})

test_that("results of a loop of round trips are garbage for a young collection", {
  # A collection the views ask for runs when the next task is submitted, before its handle
  # exists: one run while a result was decoded promoted it with its handle, and each such
  # result (megabytes of views here) stayed until a full collection.
  live_bytes <- function() .Call(mizu:::wrap__view_live)[[2]]
  with_pool(1, function(pool) {
    df <- data.frame(a = runif(2e5), b = runif(2e5), c = seq_len(2e5))
    invisible(gc(full = TRUE))  # (views earlier tests left for a full collection)
    before <- live_bytes()
    for (i in 1:100) mizu_collect(mizu_submit(pool, d, d = df))
    invisible(gc(full = FALSE))
    expect_lte(live_bytes() - before, 0)
  })
})

test_that("init runs on every worker; status and print describe the pool", {
  with_pool(2, init = quote(answer <- 42), function(pool) {
    ts <- lapply(1:4, function(i) mizu_submit(pool, answer + i, i = i))
    expect_equal(unlist(mizu_collect_all(ts)), 43:46)
    s <- mizu_pool_status(pool)
    expect_equal(nrow(s), 2L)
    expect_named(s, c("slot", "pid", "state", "busy", "tasks", "steals"))
    expect_true(all(s$pid > 0))
    expect_output(print(pool), "mizu_pool: 2 workers")
  })
})

test_that("collect returns mizu_timeout on timeout and the task stays valid", {
  with_pool(1, function(pool) {
    t <- mizu_submit(pool, { Sys.sleep(0.5); "late" })
    r <- mizu_collect(t, timeout = 0)
    expect_true(mizu_is_sentinel(r, mizu_timeout))
    expect_identical(r, mizu_timeout)
    expect_equal(mizu_collect(t), "late")
    expect_equal(mizu_collect(t), "late")   # collecting again gives the same value
  })
})

test_that("errors keep their class and message, with the remote call and traceback", {
  with_pool(1, function(pool) {
    t <- mizu_submit(pool, g(1), g = function(x) {
      h <- function(x) stop("boom ", x)
      h(x)
    })
    e <- tryCatch(mizu_collect(t), error = function(e) e)
    expect_s3_class(e, "simpleError")
    expect_equal(conditionMessage(e), "boom 1")
    expect_match(deparse(conditionCall(e)), "h\\(x\\)")
    expect_true(any(grepl("g(1)", e$traceback, fixed = TRUE)))
    expect_true(any(grepl("h(x)", e$traceback, fixed = TRUE)))
    # the same error again when collected again
    expect_error(mizu_collect(t), "boom 1")
    custom <- mizu_submit(pool, stop(structure(class = c("my_error", "error", "condition"),
                                               list(message = "custom", call = NULL, n = 7))))
    e <- tryCatch(mizu_collect(custom), my_error = function(e) e)
    expect_s3_class(e, "my_error")
    expect_equal(e$n, 7)
    # warnings on the worker do not fail the task
    expect_equal(suppressWarnings(mizu_collect(mizu_submit(pool, { warning("w"); 1 }))), 1)
    # they are signalled in the caller once: collected again, the task gives its value alone
    w <- mizu_submit(pool, { warning("careful"); 2 })
    expect_warning(v <- mizu_collect(w), "careful")
    expect_equal(v, 2)
    expect_no_warning(expect_equal(mizu_collect(w), 2))
  })
})

test_that("collect_all keeps names and order and raises the first failure with its index", {
  with_pool(2, function(pool) {
    ts <- list(a = mizu_submit(pool, 1), b = mizu_submit(pool, "two"),
               c = mizu_submit(pool, list(3)))
    expect_identical(mizu_collect_all(ts), list(a = 1, b = "two", c = list(3)))
    ts <- list(mizu_submit(pool, 1), mizu_submit(pool, stop("second")),
               mizu_submit(pool, stop("third")))
    e <- tryCatch(mizu_collect_all(ts), error = function(e) e)
    expect_equal(conditionMessage(e), "second")
    expect_equal(e$index, 2L)
    slow <- list(mizu_submit(pool, { Sys.sleep(2); 1 }))
    expect_identical(mizu_collect_all(slow, timeout = 0.05), mizu_timeout)
    expect_equal(mizu_collect_all(slow), list(1))
  })
})

test_that("collect_all hands every outcome over in order, whichever kind each is", {
  with_pool(2, function(pool) {
    # Plain values (NULL among them), a value with a warning, more values after it: the
    # warning is signalled once, the values keep their places.
    ts <- list(mizu_submit(pool, 1), mizu_submit(pool, NULL),
               mizu_submit(pool, { warning("third warns"); 3 }), mizu_submit(pool, 4),
               mizu_submit(pool, NULL))
    expect_warning(v <- mizu_collect_all(ts), "third warns")
    expect_identical(v, list(1, NULL, 3, 4, NULL))
    expect_silent(expect_identical(mizu_collect_all(ts), list(1, NULL, 3, 4, NULL)))
    # Values after a task still running when the timeout passes are left for the next call.
    ts <- list(mizu_submit(pool, 1), mizu_submit(pool, { Sys.sleep(1); 2 }), mizu_submit(pool, 3))
    expect_identical(mizu_collect_all(ts, timeout = 0.05), mizu_timeout)
    expect_identical(mizu_collect_all(ts), list(1, 2, 3))
    # A handle that is no live task, after values: its error, once the values are in.
    live <- mizu_submit(pool, 1)
    saved <- unserialize(serialize(mizu_submit(pool, 2), NULL))
    expect_error(mizu_collect_all(list(live, saved)), "not a live mizu task")
    # Many tasks, some slow: every value in its place.
    ts <- lapply(1:300, function(i) mizu_submit(pool, { if (i %% 50 == 0) Sys.sleep(0.01); i }, i = i))
    expect_identical(mizu_collect_all(ts), as.list(1:300))
  })
})

test_that("submit_batch sends every kind of batch: bindings only, the caller's variables, nested", {
  with_pool(2, function(pool) {
    # Bindings only (sent natively in one call), with names.
    b <- mizu_submit_batch(pool, list(a = quote(k + 1), b = quote(sqrt(k)), c = quote(NULL)), k = 4)
    expect_identical(mizu_collect_all(b), list(a = 5, b = 2, c = NULL))
    expect_identical(mizu_submit_batch(pool, list()), list())
    # One expression using a variable of the caller's: the whole batch finds its globals.
    offset <- 100
    b <- mizu_submit_batch(pool, list(quote(k * 2), quote(k + offset)), k = 1)
    expect_identical(mizu_collect_all(b), list(2, 101))
    # Inside a task, on the task's own pool.
    v <- mizu_collect(mizu_submit(pool, {
      p <- mizu::mizu_current_pool()
      unlist(mizu::mizu_collect_all(mizu::mizu_submit_batch(p, lapply(1:20, function(i) bquote(.(i) * m)), m = 3)))
    }))
    expect_identical(v, (1:20) * 3)
    # A binding that cannot cross fails the batch, with its class.
    e <- tryCatch(mizu_submit_batch(pool, list(quote(1), quote(2)), env = new.env()), error = identity)
    expect_s3_class(e, "mizu_error_not_portable")
  })
})

test_that("collect_any returns the first finished task; submit_batch keeps names", {
  with_pool(2, function(pool) {
    ts <- list(mizu_submit(pool, { Sys.sleep(3); "slow" }), mizu_submit(pool, "fast"))
    r <- mizu_collect_any(ts)
    expect_equal(r, list(index = 2L, value = "fast"))
    r <- mizu_collect_any(ts)
    expect_equal(r$index, 1L)
    expect_error(mizu_collect_any(ts), "already collected")
    b <- mizu_submit_batch(pool, list(x = quote(k * 1), y = quote(k * 2)), k = 5)
    expect_named(b, c("x", "y"))
    expect_equal(mizu_collect_all(b), list(x = 5, y = 10))
  })
})

test_that("a queued task can be cancelled; a running one cannot", {
  with_pool(1, function(pool) {
    started <- tempfile()
    release <- tempfile()
    busy <- mizu_submit(pool, {
      file.create(started)
      while (!file.exists(release)) Sys.sleep(0.01)
      "busy"
    }, started = started, release = release)
    deadline <- Sys.time() + 60   # a hang guard only
    while (!file.exists(started) && Sys.time() < deadline) Sys.sleep(0.01)
    expect_true(file.exists(started))
    queued <- mizu_submit(pool, "never")
    expect_false(mizu_cancel(busy))   # running now: it is not interrupted
    expect_true(mizu_cancel(queued))
    file.create(release)
    expect_error(mizu_collect(queued), class = "mizu_error_cancelled")
    expect_equal(mizu_collect(busy), "busy")
    unlink(c(started, release))
  })
})

test_that("a worker killed mid-task fails that task with its slot and pid and is replaced", {
  with_pool(1, function(pool) {
    pid <- mizu_collect(mizu_submit(pool, Sys.getpid()))
    t <- mizu_submit(pool, tools::pskill(Sys.getpid(), tools::SIGKILL))
    e <- tryCatch(mizu_collect(t), error = function(e) e)
    expect_s3_class(e, "mizu_error_worker_died")
    expect_s3_class(e, "mizu_error")
    expect_equal(e$pid, pid)
    expect_equal(e$slot, 0)
    # the replacement serves the next task
    expect_equal(mizu_collect(mizu_submit(pool, 1 + 1)), 2)
    expect_false(mizu_collect(mizu_submit(pool, Sys.getpid())) == pid)
  })
})

test_that("exec_timeout kills a stuck worker and fails its task", {
  with_pool(1, exec_timeout = 1, function(pool) {
    t <- mizu_submit(pool, Sys.sleep(60))
    expect_error(mizu_collect(t), class = "mizu_error_exec_timeout")
    expect_equal(mizu_collect(mizu_submit(pool, "alive")), "alive")
  })
})

test_that("max_tasks replaces workers after that many tasks", {
  with_pool(1, max_tasks = 2, function(pool) {
    pids <- vapply(1:6, function(i) mizu_collect(mizu_submit(pool, Sys.getpid())), 0)
    expect_gte(length(unique(pids)), 3)
  })
})

test_that("a stopped pool refuses work with mizu_error_stopped", {
  pool <- mizu_pool(1)
  t <- mizu_submit(pool, { Sys.sleep(30); 1 })
  mizu_pool_stop(pool, grace = 1)
  mizu_pool_stop(pool)   # idempotent
  expect_error(mizu_collect(t), class = "mizu_error_stopped")
  expect_error(mizu_submit(pool, 1), class = "mizu_error_stopped")
  expect_output(print(pool), "stopped")
})

test_that("bad input gives clear errors", {
  expect_error(mizu_pool(0), "n_workers")
  expect_error(mizu_pool(1.5), "n_workers")
  expect_error(mizu_pool("a"), "n_workers")
  expect_error(mizu_pool(1, exec_timeout = -1), "exec_timeout")
  expect_error(mizu_pool(1025), "n_workers. must be a whole number in 1..1024")
  for (bad in list(0, -1, 1e12, 2^20 + 1, 2.5, NA, "9")) {
    expect_error(mizu_pool(1, slots = bad), "slots. must be a whole number in 1..1048576")
  }
  expect_error(mizu_collect("nope"), "mizu_task")
  expect_error(mizu_submit(list(), 1), "mizu_pool")
  expect_error(mizu_current_pool(), class = "mizu_error")
  # a pool handle restored from a saved session is refused, not dereferenced
  pool <- mizu_pool(1)
  stale <- unserialize(serialize(pool, NULL))
  mizu_pool_stop(pool)
  expect_error(mizu_submit(stale, 1), "live mizu pool|mizu pool")
  expect_error(.Call(mizu:::wrap__task_collect, 42, 1), "mizu_task")
  expect_error(mizu_collect_all(list(1)), "list of mizu_task")
  expect_error(mizu_collect_any("x"), "list of mizu_task")
  expect_error(mizu_collect_all(list(mizu:::.native_submit)), "list of mizu_task")
  p2 <- mizu_pool(1)
  # so is a task handle, by mizu_collect_all() and a map's collection as by mizu_collect()
  live <- mizu_submit(p2, 1)
  saved <- unserialize(serialize(live, NULL))
  expect_error(mizu_collect_all(list(saved)), "not a live mizu task")
  expect_error(mizu_collect(saved), "not a live mizu task")
  expect_identical(mizu_collect_all(list(live)), list(1))
  expect_error(mizu_collect(mizu_submit(p2, 1), timeout = -1), "timeout")
  expect_error(mizu_collect(mizu_submit(p2, 1), timeout = "soon"), "timeout")
  mizu_pool_stop(p2)
})

test_that("Ctrl-C interrupts a wait and leaves the task valid", {
  out <- run_r(c(
    "library(mizu)",
    "p <- mizu_pool(1)",
    "me <- Sys.getpid()",
    "t <- mizu_submit(p, { Sys.sleep(0.5); tools::pskill(me, tools::SIGINT); Sys.sleep(1); 7 }, me = me)",
    "r <- tryCatch(mizu_collect(t), interrupt = function(e) 'interrupted')",
    "cat('first:', r, '\\n')",
    "cat('then:', mizu_collect(t), '\\n')",
    "mizu_pool_stop(p)"
  ))
  expect_true(any(grepl("first: interrupted", out)), info = paste(out, collapse = "\n"))
  expect_true(any(grepl("then: 7", out)), info = paste(out, collapse = "\n"))
})

test_that("Ctrl-C interrupts a submit waiting for queue space, one or a batch", {
  # The worker is stuck in a task; 2000 submissions fill its queue long before the first
  # SIGINT (after 1 s), the batch after it blocks at once until the second. Without the
  # interrupt checks each wait would last the 600 s of the task (the timeout is a hang guard).
  out <- run_r(c(
    "library(mizu)",
    "p <- mizu_pool(1)",
    "me <- Sys.getpid()",
    "t <- mizu_submit(p, { for (k in 1:2) { Sys.sleep(1); tools::pskill(me, tools::SIGINT) }; Sys.sleep(600) }, me = me)",
    "r <- tryCatch({ for (i in 1:2000) mizu_submit(p, i, i = i); 'all' }, interrupt = function(e) 'interrupted')",
    "cat('submit:', r, '\\n')",
    "r <- tryCatch({ mizu_submit_batch(p, lapply(1:2000, function(i) i)); 'all' }, interrupt = function(e) 'interrupted')",
    "cat('batch:', r, '\\n')",
    "mizu_pool_stop(p, grace = 0)",
    "cat('stopped\\n')"
  ), timeout = 120)
  expect_true(any(grepl("submit: interrupted", out)), info = paste(out, collapse = "\n"))
  expect_true(any(grepl("batch: interrupted", out)), info = paste(out, collapse = "\n"))
  expect_true(any(grepl("^stopped", out)), info = paste(out, collapse = "\n"))
})

test_that("Ctrl-C interrupts a pool whose workers are still starting", {
  # Each worker evaluates `init` before it joins; this one would take ten minutes.
  out <- run_r(c(
    "library(mizu)",
    # In parentheses: system() appends `&` to the whole list (else R would wait out the sleep
    # with SIGINT ignored, as system() does).
    "system(sprintf('(sleep 1; kill -INT %d)', Sys.getpid()), wait = FALSE)",
    "r <- tryCatch({ mizu_pool(1, init = quote(Sys.sleep(600))); 'started' },",
    "              interrupt = function(e) 'interrupted')",
    "cat('pool:', r, '\\n')"
  ), timeout = 120)
  expect_true(any(grepl("pool: interrupted", out)), info = paste(out, collapse = "\n"))
})

test_that("a worker still starting leaves when its owner is killed", {
  # The worker would run a ten-minute `init` before joining; kill -9 of the owner meanwhile
  # must not leave it behind. A helper script notes the owner's children (pid and command
  # line), then kills it.
  kids <- tempfile()
  helper <- tempfile(fileext = ".sh")
  writeLines(c(
    "sleep 2",
    "for c in $(cat /proc/$1/task/$1/children); do",
    "  echo \"$c $(tr '\\0' ' ' < /proc/$c/cmdline)\"",
    "done > \"$2\"",
    "kill -9 $1"
  ), helper)
  script <- tempfile(fileext = ".R")
  writeLines(c(
    sprintf(".libPaths(c(%s))", paste(encodeString(.libPaths(), quote = '"'), collapse = ", ")),
    "library(mizu)",
    sprintf("system(sprintf('(sh %s %%d %s)', Sys.getpid()), wait = FALSE)", helper, kids),
    "mizu_pool(1, init = quote(Sys.sleep(600)))"
  ), script)
  # Not `run_r`: its output pipe would stay open as long as a surviving worker holds it, and
  # with a timeout system2() ends the whole process group, the worker with it. The owner ends
  # either way: killed after 2 s, or at the pool's 60 s start timeout.
  log <- tempfile()
  system2(file.path(R.home("bin"), "Rscript"), script, stdout = log, stderr = log)
  rows <- readLines(kids)
  unlink(c(script, log))
  unlink(c(kids, helper))
  workers <- grep("worker_main", rows, value = TRUE, fixed = TRUE)
  expect_length(workers, 1L)
  pid <- as.integer(sub(" .*", "", workers))
  alive <- function(p) file.exists(sprintf("/proc/%d", p)) &&
    !grepl(") Z ", paste(readLines(sprintf("/proc/%d/stat", p), warn = FALSE), collapse = ""),
           fixed = TRUE)
  deadline <- Sys.time() + 60   # a hang guard, far below the ten minutes
  while (alive(pid) && Sys.time() < deadline) Sys.sleep(0.05)
  expect_false(alive(pid))
})

test_that("more tasks than slots: finished outcomes make room, nothing is lost", {
  with_pool(2, slots = 8L, function(pool) {
    ts <- lapply(1:200, function(i) mizu_submit(pool, i * 2L, i = i))
    expect_identical(unlist(mizu_collect_all(ts)), (1:200) * 2L)
    b <- mizu_submit_batch(pool, lapply(1:50, function(i) bquote(.(i) + 1L)))
    expect_identical(unlist(mizu_collect_all(b)), 2:51)
    expect_identical(unlist(mizu_map(pool, 1:300, function(i) -i, .chunk_size = 1)), -(1:300))
  })
})

test_that("submit_timeout bounds the wait for a free slot", {
  with_pool(1, slots = 1L, submit_timeout = 0.2, function(pool) {
    busy <- mizu_submit(pool, { Sys.sleep(2); "done" })
    expect_error(mizu_submit(pool, 1), class = "mizu_error_submit_timeout")
    expect_equal(mizu_collect(busy), "done")
    expect_equal(mizu_collect(mizu_submit(pool, 2)), 2)   # room again
  })
})

test_that("foreign external pointers are refused, not dereferenced", {
  foreign <- mizu:::.native$submit   # an external pointer that is no mizu handle
  expect_error(mizu_collect(foreign), "mizu_task")
  expect_error(mizu_submit(foreign, 1), "mizu_pool")
  with_pool(1, function(pool) {
    t <- mizu_submit(pool, 1)
    expect_error(mizu_collect(pool), "mizu_task")
    expect_error(mizu_submit(t, 1), "mizu_pool")
    expect_error(mizu_cancel(pool), "mizu_task")
    expect_equal(mizu_collect(t), 1)
    expect_equal(mizu_collect(t), 1)   # collected twice: the same value
  })
})

test_that("dropped task handles release their tasks and slots", {
  with_pool(1, slots = 4L, function(pool) {
    before <- .Call(mizu:::wrap__live_tasks)
    for (i in 1:500) mizu_submit(pool, i, i = i)   # never collected
    expect_equal(mizu_collect(mizu_submit(pool, 42)), 42)
    for (k in 1:3) gc()
    # What is left: at most the batch still being filled (64 handles share one finalizer).
    expect_lte(.Call(mizu:::wrap__live_tasks) - before, 64)
    expect_equal(mizu_collect(mizu_submit(pool, 43)), 43)
  })
})

test_that("a pool used in a forked child gives a clear error; the parent's stays usable", {
  with_pool(1, function(pool) {
    expect_equal(mizu_collect(mizu_submit(pool, 1)), 1)
    job <- parallel::mcparallel(tryCatch(mizu_submit(pool, 2), error = conditionMessage))
    out <- parallel::mccollect(job)[[1]]
    expect_match(out, "forked child")
    expect_equal(mizu_collect(mizu_submit(pool, 3)), 3)
  })
})

test_that("the no-op routine the benchmark times R's own part with returns its first argument", {
  expect_identical(.Call(mizu:::.native_nop, 1L, "b", NULL, NULL), 1L)
})

test_that("the machine floor the benchmarks print is measured, or refused clearly", {
  ns <- .Call(mizu:::wrap__line_round_trip_ns, 0L, 1L)
  expect_true(ns > 0 && ns < 1e6)   # a cache line's round trip: nanoseconds
  expect_error(.Call(mizu:::wrap__line_round_trip_ns, 0L, 0L), "two different CPUs")
  expect_error(.Call(mizu:::wrap__line_round_trip_ns, 0L, -1L), "no CPU -1")
  expect_error(.Call(mizu:::wrap__line_round_trip_ns, 0L, 100000L))   # not a hang
})

test_that("a worker that grew by a large task gives the memory back once idle", {
  with_pool(1, function(pool) {
    pid <- mizu_pool_status(pool)$pid
    rss_mb <- function() {
      line <- grep("^VmRSS", readLines(sprintf("/proc/%d/status", pid)), value = TRUE)
      as.numeric(gsub("[^0-9]", "", line)) / 1024
    }
    before <- rss_mb()
    # ~190 MB of garbage, in vectors small enough for the heap the worker keeps
    mizu_collect(mizu_submit(pool, {
      for (k in 1:8) assign(paste0("x", k), numeric(3e6) + k)
      NULL
    }))
    expect_gt(rss_mb(), before + 150)
    deadline <- Sys.time() + 20  # (a hang guard: an idle worker does this after 0.5 s)
    while (rss_mb() > before + 50 && Sys.time() < deadline) Sys.sleep(0.1)
    expect_lt(rss_mb(), before + 50)
  })
})
