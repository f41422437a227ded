# R pools of Python workers (language = "python"): real `python -m pymizu.worker` processes of
# the interpreter in MIZU_PYTHON (cargo xtask test sets it to the project's venv).

test_that("the examples: named functions, source, maps", {
  with_pool(2, language = "python", function(pool) {
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call("statistics.fmean", c(1, 2, 3)))), 2)
    x <- runif(10)
    got <- mizu_collect(mizu_submit(pool, mizu_call(
      source = "import numpy as np\nfloat(np.sum(x))", x = x)))
    expect_equal(got, sum(x))
    expect_identical(mizu_map(pool, list(1:3, 4:6), mizu_call("builtins.sum")), list(6L, 15L))
    # Extra named arguments of mizu_submit() are keyword arguments.
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call("builtins.round", 2.567), ndigits = 1L)), 2.6)
    # The call is evaluated in the caller's frame.
    f <- function(k) mizu_collect(mizu_submit(pool, mizu_call("builtins.abs", k)))
    expect_identical(f(-3L), 3L)
  })
})

test_that("what is submitted to Python workers is evaluated in the caller; a non-call fails clearly", {
  with_pool(1, language = "python", function(pool) {
    # The expression is evaluated once, where mizu_submit() was called.
    n <- 0L
    make <- function() { n <<- n + 1L; mizu_call("builtins.abs", -n) }
    expect_identical(mizu_collect(mizu_submit(pool, make())), 1L)
    expect_identical(n, 1L)
    # An R error while evaluating it is the caller's own error, and the pool goes on.
    expect_error(mizu_submit(pool, stop("not a call today")), "not a call today")
    # An R expression's value is not a task for Python workers.
    expect_error(mizu_submit(pool, 1 + 1), "mizu_call\\(\\) tasks", class = "mizu_error_not_portable")
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call("builtins.abs", -2L))), 2L)
  })
})

test_that("values cross with their types, both ways", {
  with_pool(1, language = "python", function(pool) {
    ident <- function(v) mizu_collect(mizu_submit(pool, mizu_call(source = "x", x = v)))
    expect_identical(ident(NULL), NULL)
    expect_identical(ident(TRUE), TRUE)
    expect_identical(ident(7L), 7L)
    expect_identical(ident(2.5), 2.5)
    expect_identical(ident(1+2i), 1+2i)
    expect_identical(ident("héllo"), "héllo")
    expect_identical(ident(as.raw(c(0, 1, 255))), as.raw(c(0, 1, 255)))
    expect_identical(ident(list(1L, "a", NULL)), list(1L, "a", NULL))
    expect_identical(ident(list(a = 1.5, b = list(TRUE))), list(a = 1.5, b = list(TRUE)))
    expect_identical(ident(c(1.5, NA, 3)), c(1.5, NA, 3))
    expect_identical(ident(c(1L, NA, 3L)), c(1L, NA, 3L))
    expect_identical(ident(c(TRUE, NA, FALSE)), c(TRUE, NA, FALSE))
    expect_identical(ident(c("a", NA, "c")), c("a", NA, "c"))
    m <- matrix(as.numeric(1:6), 2, 3)
    expect_identical(ident(m), m)
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call(source = "x.shape", x = m))), list(2L, 3L))
    d <- as.Date("2024-01-02") + 0:2
    expect_identical(ident(d), d)
    f <- factor(c("x", "y", NA, "x"), levels = c("y", "x"))
    expect_identical(ident(f), f)
    df <- data.frame(a = 1:5, b = c(1.5, NA, 3, 4, 5), s = c("a", NA, "c", "d", "e"),
                     f = factor(c("x", "y", "x", "y", "x")), d = as.Date("2020-01-01") + 0:4)
    expect_identical(ident(df), df)
    rows <- mizu_collect(mizu_submit(pool, mizu_call(source = "import pyarrow as pa\npa.table(x).num_rows", x = df)))
    expect_identical(rows, 5L)
  })
})

test_that("a Python exception is a classed condition with type, message and traceback", {
  with_pool(1, language = "python", function(pool) {
    e <- tryCatch(mizu_collect(mizu_submit(pool, mizu_call("fractions.Fraction", 1L, 0L))),
                  error = function(e) e)
    expect_s3_class(e, "mizu_error_python")
    expect_s3_class(e, "mizu_error_task")
    expect_identical(e$type, "ZeroDivisionError")
    expect_true("ArithmeticError" %in% e$classes)
    expect_match(conditionMessage(e), "ZeroDivisionError")
    expect_match(e$traceback, "fractions.py")
    # The pool goes on.
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call("builtins.len", list(1, 2)))), 2L)
  })
})

test_that("values that cannot cross fail at submit, naming where they sit", {
  with_pool(1, language = "python", function(pool) {
    e <- tryCatch(mizu_submit(pool, mizu_call("builtins.len", list(a = list(1, new.env())))),
                  error = function(e) e)
    expect_s3_class(e, "mizu_error_not_portable")
    expect_match(conditionMessage(e), "argument 1\\$a\\[\\[2\\]\\]: an environment cannot cross")
    e <- tryCatch(mizu_submit(pool, mizu_call("builtins.len", function(x) x)), error = function(e) e)
    expect_s3_class(e, "mizu_error_not_portable")
    expect_error(mizu_submit(pool, 1 + 1), "mizu_call")
    # A hand-made call whose parts are wrong is refused, not read past.
    bad <- structure(list(target = 1, source = FALSE, args = list(), kwargs = list()), class = "mizu_call")
    expect_error(mizu_submit(pool, bad), "needs a target")
    bad <- structure(list(target = "builtins.abs", source = FALSE), class = "mizu_call")
    expect_error(mizu_submit(pool, bad), "four parts")
    bad <- structure(list(target = "builtins.abs", source = FALSE, args = list(), kwargs = list(1)),
                     class = "mizu_call")
    expect_error(mizu_submit(pool, bad), "must be named")
    expect_error(mizu_submit(pool, mizu_call("builtins.abs", -1L), 3), "must be named")
    # A result that cannot cross fails its task, naming what it was.
    e <- tryCatch(mizu_collect(mizu_submit(pool, mizu_call(source = "{1, 2}"))),
                  error = function(e) e)
    expect_s3_class(e, "mizu_error_python")
    expect_match(conditionMessage(e), "result: a set cannot cross")
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call("builtins.abs", -1L))), 1L)
  })
})

test_that("seeded maps give the same numbers as R workers and numpy", {
  dir <- tempfile("pymod")
  dir.create(dir)
  writeLines(c("import pymizu", "def draw(n):", "    return pymizu.current_rng().random(n)"),
             file.path(dir, "mizu_draw.py"))
  old <- Sys.getenv("PYTHONPATH")
  Sys.setenv(PYTHONPATH = dir)
  on.exit({
    Sys.setenv(PYTHONPATH = old)
    unlink(dir, recursive = TRUE)
  })
  with_pool(2, language = "python", function(pool) {
    py <- mizu_map(pool, rep(3L, 4), mizu_call("mizu_draw.draw"), .seed = 42)
    for (i in 1:4) expect_identical(py[[i]], mizu_stream(42, i, 3))
    # Chunked any way, the same numbers.
    for (size in list(1, 4, NULL, 30)) {
      py <- mizu_map(pool, rep(2L, 30), mizu_call("mizu_draw.draw"), .seed = 7, .chunk_size = size)
      for (i in 1:30) expect_identical(py[[i]], mizu_stream(7, i, 2))
    }
  })
  with_pool(2, function(pool) {
    r <- mizu_map(pool, 1:4, function(i) runif(3), .seed = 42)
    for (i in 1:4) expect_identical(r[[i]], mizu_stream(42, i, 3))
  })
})

test_that("maps over Python workers travel in chunks, with the same values for any chunk size", {
  with_pool(2, language = "python", function(pool) {
    xs <- as.list(as.numeric(0:499))
    want <- lapply(xs, sqrt)
    for (size in list(NULL, 1, 7, 500)) {
      expect_identical(mizu_map(pool, xs, mizu_call("math.sqrt"), .chunk_size = size), want)
    }
    # Fixed arguments first, then the element; further named arguments are keywords.
    got <- mizu_map(pool, c("x", "y", "z"), mizu_call("operator.add", "a-"), .chunk_size = 2)
    expect_identical(got, list("a-x", "a-y", "a-z"))
    expect_identical(mizu_map(pool, c(2.567, 1.234), "builtins.round", ndigits = 1L),
                     list(2.6, 1.2))
    # Names are kept; NULL results stay in place; an empty map is empty.
    expect_identical(mizu_map(pool, c(a = 4, b = 9), "math.sqrt"), list(a = 2, b = 3))
    expect_identical(mizu_map(pool, list(NULL, 1L), "builtins.repr", .chunk_size = 2),
                     list("None", "1"))
    expect_identical(mizu_map(pool, list(0, 0, 0), "time.sleep", .chunk_size = 3),
                     list(NULL, NULL, NULL))
    expect_identical(mizu_map(pool, list(), "math.sqrt"), list())
    expect_error(mizu_map(pool, 1:2, "math.sqrt", .chunk_size = 0), "chunk_size")
  })
})

test_that("a failing element of a chunk names its position", {
  with_pool(2, language = "python", function(pool) {
    for (size in list(1, 2, 5)) {
      e <- tryCatch(mizu_map(pool, list("1", "2", "x", "4", "y"), "builtins.int", .chunk_size = size),
                    error = identity)
      expect_s3_class(e, "mizu_error_python")
      expect_identical(e$index, 3)
      expect_identical(e$type, "ValueError")
    }
    # A result that cannot cross names its element (the worker counts from 0; `index`, as
    # everywhere in R, from 1).
    e <- tryCatch(mizu_map(pool, list("1", "2"), "builtins.set", .chunk_size = 2),
                  error = identity)
    expect_match(conditionMessage(e), "element 0: a set cannot cross")
    expect_identical(e$index, 1)
    expect_identical(mizu_map(pool, list(4, 9), "math.sqrt"), list(2, 3))
  })
})

test_that("a killed Python worker fails only its task; the pool goes on", {
  with_pool(1, language = "python", function(pool) {
    t <- mizu_submit(pool, mizu_call("time.sleep", 30))
    for (i in 1:3000) {
      s <- mizu_pool_status(pool)
      if (any(s$busy)) break
      Sys.sleep(0.01)
    }
    tools::pskill(s$pid[[1]], tools::SIGKILL)
    expect_error(mizu_collect(t, timeout = 30), class = "mizu_error_worker_died")
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call("builtins.abs", -2L)), timeout = 60), 2L)
  })
})

test_that("a missing Python is a clear error at pool start", {
  old <- Sys.getenv("MIZU_PYTHON")
  on.exit(Sys.setenv(MIZU_PYTHON = old))
  Sys.setenv(MIZU_PYTHON = "/nonexistent/python3")
  expect_error(mizu_pool(1, language = "python"), "pymizu")
})

test_that("a channel to a Python peer, both ways", {
  src <- paste("import numpy as np",
               "for m in channel:",
               "    channel.send({'sum': float(np.sum(m['x'])), 'n': len(m['x']), 'tag': m['tag']})",
               sep = "\n")
  ch <- mizu_channel(src, language = "python")
  expect_true(mizu_send(ch, list(x = c(1, 2, 3.5), tag = "a")))
  expect_identical(mizu_recv(ch, timeout = 60), list(sum = 6.5, n = 3L, tag = "a"))
  # (Vectors of one element are scalars in Python: these have two or more.)
  xs <- lapply(1:3, function(i) list(x = as.numeric(seq_len(i + 1)), tag = "b"))
  expect_identical(mizu_send_batch(ch, xs), 3L)
  got <- lapply(1:3, function(i) mizu_recv(ch, timeout = 60)$n)
  expect_identical(got, list(2L, 3L, 4L))
  expect_error(mizu_send(ch, list(x = new.env())), "environment cannot cross")
  expect_identical(mizu_close(ch, wait = 30), 0L)
})

test_that("a killed Python peer is mizu_peer_gone", {
  ch <- mizu_channel("import os, time\nchannel.send(os.getpid())\ntime.sleep(60)", language = "python")
  pid <- mizu_recv(ch, timeout = 60)
  tools::pskill(pid, tools::SIGKILL)
  expect_identical(mizu_recv(ch, timeout = 60), mizu_peer_gone)
  mizu_close(ch, wait = 0)
})

test_that("random data frames cross R -> Python (pyarrow) -> R unchanged", {
  set.seed(2026)
  with_pool(1, language = "python", function(pool) {
    via <- mizu_call(source = "import pyarrow as pa\npa.table(x)")
    for (k in 1:25) {
      n <- sample(c(1L, 2L, 17L, 1000L, 5000L), 1L)
      na <- function(v) { v[runif(n) < 0.1] <- NA; v }
      cols <- list()
      for (j in seq_len(sample(1:6, 1L))) {
        cols[[paste0("c", j)]] <- switch(sample(1:7, 1L),
          na(rnorm(n)),
          na(sample.int(1e6, n, replace = TRUE)),
          na(runif(n) < 0.5),
          na(sample(c("a", "b\u00e9", "", "\u6c34"), n, replace = TRUE)),
          na(factor(sample(c("x", "y", "z"), n, replace = TRUE), levels = c("z", "y", "x"))),
          na(as.Date("1960-01-01") + sample(-5000:40000, n, replace = TRUE)),
          na(as.POSIXct(round(runif(n, -1e9, 2e9)), origin = "1970-01-01", tz = "UTC")))
      }
      df <- as.data.frame(cols, stringsAsFactors = FALSE)
      mizu_submit(pool, via, x = df) -> t
      back <- mizu_collect(t)
      expect_identical(back, df)
    }
  })
})

test_that("more rows of the mapping, R -> Python -> R", {
  with_pool(1, language = "python", function(pool) {
    ident <- function(v) mizu_collect(mizu_submit(pool, mizu_call(source = "x", x = v)))
    tm <- as.POSIXct(c("2024-03-10 01:30:00", NA, "2024-11-03 12:00:00"), tz = "America/New_York")
    expect_identical(ident(tm), tm)
    d <- as.difftime(c(1.5, NA, 3), units = "hours")
    expect_identical(ident(d), d)
    o <- factor(c("lo", "hi", NA, "lo"), levels = c("lo", "hi"), ordered = TRUE)
    expect_identical(ident(o), o)
    i64 <- structure(c(1, 2), class = "integer64")   # bit64's layout: the doubles hold int64 bits
    expect_identical(ident(i64), i64)
    expect_identical(ident(c(a = 1.5, b = 2)), list(a = 1.5, b = 2))   # a named vector is a dict
    expect_identical(ident(NA_real_), NA_real_)                        # the NA payload survives
    expect_identical(ident(NA), NULL)                                 # a logical NA is None
    a <- array(as.numeric(1:24), dim = c(2, 3, 4))
    expect_identical(ident(a), a)
    expect_identical(mizu_collect(mizu_submit(pool, mizu_call(source = "float(x[1, 2, 3])", x = a))),
                     a[2, 3, 4])
    e <- tryCatch(mizu_submit(pool, mizu_call("builtins.len", 1:3 + 0i)), error = function(e) e)
    expect_s3_class(e, "mizu_error_not_portable")
  })
})

test_that("dates and times with NA reach Python as numpy with NaT and come back identical", {
  with_pool(1, language = "python", function(pool) {
    run <- function(src, v) mizu_collect(mizu_submit(pool, mizu_call(source = src, x = v)))
    d <- as.Date(c("2001-02-03", NA, "1969-12-31"))
    tm <- .POSIXct(c(NA, 0.5, 1.7e9), tz = "UTC")
    dt <- as.difftime(c(2, NA), units = "secs")
    expect_identical(run("import numpy as np\n[str(x.dtype), bool(np.isnat(x[1]))]",
                         d), list("datetime64[D]", TRUE))
    expect_identical(run("x", d), d)
    expect_identical(run("x", tm), tm)
    expect_identical(run("x", dt), dt)
    # Made in Python.
    expect_identical(run("import numpy as np\nnp.array(['2001-02-03', 'NaT'], dtype='datetime64[D]')", NULL),
                     as.Date(c("2001-02-03", NA)))
    # As data frame columns, both ways.
    df <- data.frame(d = d, tm = tm[c(1, 2, 3)], n = c(1, NA, 3))
    expect_identical(run("x", df), df)
    expect_identical(run("import pyarrow as pa\npa.table(x)", df), df)
  })
})

test_that("a data frame relayed unmodified comes back by reference", {
  with_pool(1, language = "python", function(pool) {
    ident <- function(v) mizu_collect(mizu_submit(pool, mizu_call(source = "x", x = v)))
    df <- data.frame(a = as.numeric(1:1e5), i = 1:1e5, s = as.character(1:1e5),
                     f = factor(rep(c("u", "v"), 5e4)), stringsAsFactors = FALSE)
    back <- ident(df)
    # Python sent back what it received: R's views read the region R wrote the task into.
    # (Checked before anything reads the views: R's identical() copies a view it compares.)
    mine <- sprintf("mizu_%x_", Sys.getpid())
    seg <- .Call(mizu:::wrap__view_segment, back$a)
    expect_true(grepl(mine, seg, fixed = TRUE))
    # Relayed again, unmodified: the same region (nothing copied either way).
    again <- ident(back)
    expect_identical(.Call(mizu:::wrap__view_segment, again$s), seg)
    expect_identical(.Call(mizu:::wrap__view_segment, again$f), seg)
    expect_identical(back, df)
    expect_identical(again, df)
    # Modified, it is copied (and comes back with the change).
    changed <- back
    changed$a[1] <- -1
    got <- ident(changed)
    expect_identical(got$a[1:2], c(-1, 2))
    expect_identical(got$s, df$s)
  })
})

test_that("nested maps inside Python tasks run on the pool's Python workers", {
  with_pool(2, language = "python", function(pool) {
    pids <- mizu_pool_status(pool)$pid
    got <- mizu_collect(mizu_submit(pool, mizu_call(
      source = "import pymizu, operator\npymizu.current_pool().map(operator.neg, [1, 2, 3])")), timeout = 60)
    expect_identical(got, list(-1L, -2L, -3L))
    ran <- mizu_collect(mizu_submit(pool, mizu_call(
      source = "import pymizu, os\npymizu.current_pool().map(lambda _: os.getpid(), range(6))")), timeout = 60)
    expect_true(all(unlist(ran) %in% pids))
    # Seeded: element i draws from the stream (5, i), as in a map submitted from R.
    inner <- mizu_collect(mizu_submit(pool, mizu_call(
      source = "import pymizu\npymizu.current_pool().map(lambda _: float(pymizu.current_rng().random()), range(3), seed=5)")), timeout = 60)
    for (i in 1:3) expect_identical(inner[[i]], mizu_stream(5, i, 1))
  })
})
