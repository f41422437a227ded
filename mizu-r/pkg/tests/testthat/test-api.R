# The R API's edges: task errors' classes, values that cannot be sent, task variables named
# like the functions' own arguments, and what a stopped pool or closed channel leaves behind.

test_that("a task's error keeps its classes, with mizu_error_task first and its call and traceback", {
  with_pool(1, function(pool) {
    t <- mizu_submit(pool, {
      inner <- function() stop(structure(class = c("my_error", "error", "condition"),
                                         list(message = "bad input", call = quote(inner()))))
      inner()
    })
    e <- tryCatch(mizu_collect(t), error = identity)
    expect_identical(class(e), c("mizu_error_task", "my_error", "error", "condition"))
    expect_equal(conditionMessage(e), "bad input")
    expect_equal(conditionCall(e), quote(inner()))
    expect_true(any(grepl("inner()", e$traceback, fixed = TRUE)))
    e <- tryCatch(mizu_collect(mizu_submit(pool, stop("plain"))), error = identity)
    expect_identical(class(e), c("mizu_error_task", "simpleError", "error", "condition"))
    # In a map too, with the element's position.
    e <- tryCatch(mizu_map(pool, 1:3, function(i) if (i == 2) stop("two") else i),
                  error = identity)
    expect_s3_class(e, "mizu_error_task")
    expect_s3_class(e, "simpleError")
    expect_equal(e$index, 2L)
  })
})

test_that("environments and external pointers fail at submit, naming where they sit", {
  with_pool(1, function(pool) {
    e <- tryCatch(mizu_submit(pool, ls(env), env = new.env()), error = identity)
    expect_s3_class(e, "mizu_error_not_portable")
    expect_s3_class(e, "mizu_error")
    expect_match(conditionMessage(e), "argument `env`: an environment", fixed = TRUE)
    e <- tryCatch(mizu_submit(pool, 1, cfg = list(a = 1, inner = list(2, new.env()))),
                  error = identity)
    expect_s3_class(e, "mizu_error_not_portable")
    expect_match(conditionMessage(e), "argument `cfg`$inner[[2]]", fixed = TRUE)
    xp <- methods::new("externalptr")
    expect_equal(typeof(xp), "externalptr")
    e <- tryCatch(mizu_submit(pool, 1, p = xp), error = identity)
    expect_s3_class(e, "mizu_error_not_portable")
    expect_match(conditionMessage(e), "argument `p`: an external pointer", fixed = TRUE)
    e <- tryCatch(mizu_submit_batch(pool, list(quote(1)), env = new.env()), error = identity)
    expect_s3_class(e, "mizu_error_not_portable")
    e <- tryCatch(mizu_map(pool, 1:2, function(i, env) i, env = new.env()), error = identity)
    expect_s3_class(e, "mizu_error_not_portable")
    expect_match(conditionMessage(e), "argument `env`", fixed = TRUE)
    e <- tryCatch(mizu_map(pool, list(1, new.env()), function(x) 1), error = identity)
    expect_s3_class(e, "mizu_error_not_portable")
    expect_match(conditionMessage(e), "`.x` element 2", fixed = TRUE)
    # What travels by name, and functions with their environments, still go.
    expect_true(mizu_collect(mizu_submit(pool, identical(g, globalenv()), g = globalenv())))
    k <- 5
    f <- function(x) x * k
    expect_equal(mizu_collect(mizu_submit(pool, f(2), f = f)), 10)
    expect_equal(mizu_collect(mizu_submit(pool, 1 + 1)), 2)
  })
})

test_that("task variables named like a prefix of the functions' arguments are task variables", {
  with_pool(1, function(pool) {
    expect_equal(mizu_collect(mizu_submit(pool, e + p, e = 1, p = 2)), 3)
    expect_equal(mizu_collect(mizu_submit(pool, ex * 2, ex = 21)), 42)
    expect_equal(mizu_collect(mizu_submit(pool, po, po = "x")), "x")
    ts <- mizu_submit_batch(pool, list(quote(e * 2), quote(e * 3)), e = 5)
    expect_equal(unlist(mizu_collect_all(ts)), c(10, 15))
    expect_equal(unlist(mizu_map(pool, 1:3, function(i, p) i + p, p = 10)), 11:13)
    # Positional use, as documented, is unchanged.
    expect_equal(mizu_collect(mizu_submit(pool, x + 1, x = 1)), 2)
  })
  ch <- mizu_channel(mizu_send(channel, e * 2), e = 21)
  expect_equal(mizu_recv(ch, timeout = 30), 42)
  mizu_close(ch)
  call <- mizu_call("statistics.fmean", t = 1)
  expect_equal(call$target, "statistics.fmean")
  expect_equal(call$kwargs$t, 1)
})

test_that("a stopped pool leaves nothing in /dev/shm, without waiting or collecting garbage", {
  before <- shm_names()
  pool <- mizu_pool(2)
  x <- mizu_collect(mizu_submit(pool, sum(v), v = runif(1e5)))
  pending <- mizu_submit(pool, { Sys.sleep(5); 1 })
  mizu_pool_stop(pool)
  expect_identical(setdiff(shm_names(), before), character())
  expect_error(mizu_collect(pending), class = "mizu_error_stopped")
})

test_that("a closed channel leaves nothing in /dev/shm, without collecting garbage", {
  before <- shm_names()
  ch <- mizu_channel({
    x <- mizu_recv(channel)
    mizu_send(channel, sum(x))
  })
  mizu_send(ch, runif(1e5))
  expect_true(is.numeric(mizu_recv(ch, timeout = 30)))
  mizu_close(ch)
  expect_identical(setdiff(shm_names(), before), character())
  expect_true(mizu_is_sentinel(mizu_recv(ch, timeout = 0), mizu_closed))
})
