roundtrip <- function(pool, x) mizu_collect(mizu_submit(pool, x, x = x))

test_that("vectors of every kind round-trip with their attributes, small and large", {
  with_pool(1, function(pool) {
    for (n in c(3L, 10000L)) {
      d <- c(1.5, NA, NaN, -0, Inf, -Inf)
      values <- list(
        int = c(seq_len(n - 1L), NA),
        dbl = rep_len(d, n),
        lgl = rep_len(c(TRUE, FALSE, NA), n),
        raw = as.raw(seq_len(n) %% 256L),
        cplx = complex(real = seq_len(n), imaginary = -seq_len(n)),
        chr = rep_len(c("a", NA, "\u00e9t\u00e9", ""), n),
        fct = factor(rep_len(c("lo", "hi", NA), n), levels = c("lo", "hi")),
        date = as.Date("2024-02-29") + seq_len(n),
        time = as.POSIXct("2024-01-01 12:00:00", tz = "Asia/Tokyo") + seq_len(n),
        dt = as.difftime(seq_len(n), units = "mins"),
        named = stats::setNames(seq_len(n) * 1.0, paste0("n", seq_len(n))),
        mat = matrix(seq_len(2 * n) * 1.0, nrow = 2, dimnames = list(c("a", "b"), NULL))
      )
      for (nm in names(values)) {
        got <- roundtrip(pool, values[[nm]])
        expect_identical(got, values[[nm]], label = sprintf("%s (n = %d)", nm, n))
      }
      # NA_real_ keeps its payload bits (R tells NA from NaN by them)
      got <- roundtrip(pool, rep_len(c(NA_real_, NaN), n))
      expect_true(is.na(got[1]) && !is.nan(got[1]))
      expect_true(is.nan(got[2]))
    }
  })
})

test_that("large vectors arrive as views of shared memory; modifying one copies it", {
  with_pool(1, function(pool) {
    x <- runif(1e5)
    got <- mizu_collect(mizu_submit(pool, list(a = x, b = x * 2), x = x))
    expect_true(mizu_is_view(got$a))
    expect_true(mizu_is_shared(got$a))
    expect_false(mizu_is_view(x))
    expect_equal(sum(got$a), sum(x))
    y <- got$a
    y[1] <- -1
    expect_equal(y[1], -1)
    expect_equal(got$a[1], x[1])          # the view itself is unchanged
    got$b[2] <- 0                          # in place on the view: it becomes private
    expect_false(mizu_is_shared(got$b))
    expect_equal(got$b[2], 0)
    expect_equal(got$b[-2], (x * 2)[-2])
    # small vectors travel inside the serialization
    expect_false(mizu_is_view(mizu_collect(mizu_submit(pool, 1:10))))
  })
})

test_that("a view sent on arrives intact, and outlives the pool that produced it", {
  p1 <- mizu_pool(1)
  v <- mizu_collect(mizu_submit(p1, seq(0, 1, length.out = 50000)))
  f <- mizu_collect(mizu_submit(p1, factor(rep(letters[1:3], 20000))))
  mizu_pool_stop(p1)
  # the producing workers are gone; the pages stay mapped while the views exist
  expect_equal(v[50000], 1)
  expect_equal(levels(f), c("a", "b", "c"))
  expect_equal(as.integer(table(f)), rep(20000L, 3))
  with_pool(1, function(p2) {
    expect_identical(mizu_collect(mizu_submit(p2, v, v = v)), v)
    expect_equal(mizu_collect(mizu_submit(p2, sum(v), v = v)), sum(seq(0, 1, length.out = 50000)))
  })
  gc()
})

test_that("data frames round-trip; the worker adds a column", {
  n <- 54000L
  df <- data.frame(
    id = seq_len(n), x = runif(n), y = rnorm(n), z = seq_len(n) / 7,
    g = factor(sample(c("a", "b", "c"), n, TRUE)),
    h = factor(sample(month.name, n, TRUE), levels = month.name),
    flag = sample(c(TRUE, FALSE, NA), n, TRUE),
    when = as.Date("2020-01-01") + seq_len(n) %% 1000,
    name = sample(c("ann", "bob", NA), n, TRUE),
    k = sample(1:100, n, TRUE)
  )
  with_pool(1, function(pool) {
    got <- mizu_collect(mizu_submit(pool, { d$w <- d$x * 2 + d$k; d }, d = df))
    expected <- df
    expected$w <- df$x * 2 + df$k
    expect_identical(got, expected)
    expect_true(mizu_is_view(got$x))
    expect_identical(attributes(got$g), attributes(df$g))
    expect_identical(mizu_collect(mizu_submit(pool, d, d = df[0, ])), df[0, ])
  })
})

test_that("general objects travel through R's serialization", {
  with_pool(1, function(pool) {
    # (An environment itself cannot be a binding: see test-api.R. One a function or a
    # model refers to travels with it, as R serializes it.)
    f <- local({ k <- 10; function(x) x + k })
    fit <- stats::lm(mpg ~ wt, data = datasets::mtcars)
    got <- mizu_collect(mizu_submit(pool, list(f(1), class(fit), coef(fit), predict(fit)[1:2]),
                                    f = f, fit = fit))
    expect_identical(got, list(11, "lm", coef(fit), predict(fit)[1:2]))
    nested <- list(a = list(b = list(c = runif(10000))), d = "x")
    expect_identical(mizu_collect(mizu_submit(pool, n, n = nested)), nested)
  })
})

test_that("malformed payloads give errors, never crashes", {
  bad <- list(raw(0), as.raw(0xff), charToRaw("r"),
              as.raw(c(0x72, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, rep(0, 8))),
              as.raw(c(0x72, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                       rep(0xff, 16), 9, rep(0, 7))),
              c(charToRaw("R"), as.raw(1:40)))
  for (b in bad) expect_error(.Call(mizu:::wrap__codec_decode, b), "malformed")
  good <- .Call(mizu:::wrap__codec_encode, list(a = runif(2000), m = matrix(1:4000, 2),
                                                 s = rep(c("x", NA, "\u00e9"), 300)))
  for (cut in c(20L, 100L, length(good) - 8L)) {
    expect_error(.Call(mizu:::wrap__codec_decode, good[seq_len(cut)]), "malformed")
  }
  # flipping bytes anywhere never crashes: either an error or some value
  set.seed(3)
  outcomes <- vapply(1:300, function(i) {
    b <- good
    k <- sample(length(b), 3)
    b[k] <- as.raw(sample(0:255, 3))
    r <- tryCatch(.Call(mizu:::wrap__codec_decode, b),
                  error = function(e) if (grepl("malformed", conditionMessage(e))) "error" else "?")
    if (identical(r, "error")) "error" else if (identical(r, "?")) "other error" else "value"
  }, "")
  expect_length(outcomes, 300)                   # the process survived every one
  expect_false("other error" %in% outcomes)      # errors say the payload is malformed
  expect_true("error" %in% outcomes)
  # R's reader trusts lengths: a negative one (a flipped high byte) once crashed it
  p <- .Call(mizu:::wrap__codec_encode, rep("abc", 600))
  at <- grepRaw(charToRaw("mizu_oob_0"), p)
  b <- p
  b[at - 1] <- as.raw(0xa7)                       # the name's length, now negative
  expect_error(.Call(mizu:::wrap__codec_decode, b), "malformed payload: the serialization")
  # flipping bytes of the Arrow data (data frames, strings, factors) never crashes, and what
  # decodes can be read
  n <- 3000L
  df <- data.frame(i = c(NA, seq_len(n - 1L)), x = runif(n), l = rep_len(c(TRUE, NA), n),
                   f = factor(rep_len(c("a", "b", NA), n)), d = as.Date("2020-01-01") + seq_len(n),
                   s = rep_len(c("x", "\u00e9", NA), n))
  set.seed(5)
  for (v in list(df, df$s, df$f)) {
    p <- .Call(mizu:::wrap__codec_encode, v)
    oob <- sum(as.integer(p[17:24]) * 256^(0:7))   # where the first buffer starts
    survived <- vapply(1:600, function(i) {
      b <- p
      k <- oob + sample(length(p) - oob, sample(1:3, 1))
      b[k] <- as.raw(sample(0:255, length(k), TRUE))
      tryCatch({
        x <- .Call(mizu:::wrap__codec_decode, b)
        invisible(lapply(if (is.list(x)) x else list(x), function(c) c[1:3]))
        TRUE
      }, error = function(e) grepl("malformed", conditionMessage(e)))
    }, NA)
    expect_true(all(survived))
  }
  # text payloads (runtime errors) decode as text
  expect_equal(.Call(mizu:::wrap__codec_decode, charToRaw("Thello")), "hello")
  v <- list(a = runif(1e4), b = "x", f = factor(rep(c("u", "v"), 5000)))
  expect_identical(.Call(mizu:::wrap__codec_roundtrip, v), v)
})

test_that("an unreadable serialization is mizu's error alone (R prints nothing of its own)", {
  out <- run_r(c(
    "bad <- c(charToRaw('R'), as.raw(1:40))",
    "r <- tryCatch(.Call(mizu:::wrap__codec_decode, bad), error = conditionMessage)",
    "cat('got:', r, '\\n')",
    "cat('option:', getOption('show.error.messages'), '\\n')"
  ))
  text <- paste(out, collapse = "\n")
  expect_true(any(grepl("got: .*malformed", out)), info = text)
  expect_true(any(grepl("option: TRUE", out)), info = text)   # put back as it was
  expect_false(any(grepl("unknown input format", out)), info = text)
})

test_that("a decoded serialization survives a garbage collection at every allocation", {
  # What `future`'s results look like (a classed list with times and nested lists): decoded
  # through R's serialization, under gctorture, so that a value left unprotected for a moment
  # is collected and its memory reused.
  v <- structure(list(value = 7L, visible = TRUE, started = Sys.time(),
                      info = list(a = 1:3, b = "x")), class = "FutureResult")
  b <- .Call(mizu:::wrap__codec_encode, v)
  expect_identical(rawToChar(b[1]), "R")
  same <- logical(20)
  for (i in seq_along(same)) {
    gctorture(TRUE)
    x <- .Call(mizu:::wrap__codec_decode, b)
    gctorture(FALSE)
    same[[i]] <- identical(x, v)
  }
  expect_true(all(same), info = paste(sum(!same), "of 20 decoded values differ"))
})

test_that("small plain values take the compact encoding and round-trip exactly", {
  global_fun <- function(f) {
    environment(f) <- globalenv()
    utils::removeSource(f)
  }
  no_src <- function(text) parse(text = text, keep.source = FALSE)[[1]]
  compact <- list(NULL, TRUE, NA, 1L, NA_integer_, c(1.5, NA, NaN, -0, Inf), 2 + 3i,
                  "a", NA_character_, c("\u00e9t\u00e9", "x"), as.raw(0:255), character(0),
                  list(), list(1, "a", list(NULL)), c(a = 1, b = 2), list(x = 1, 2),
                  quote(x), quote(f(x, y = 2)), quote(x[, 1]), quote(f(a = , b)),
                  list("e", quote(x + y), list(x = 1L, y = 2)),
                  # functions of the global environment (arriving as functions of the
                  # receiver's), without attributes (a srcref) or compiled code
                  global_fun(function(x, y = 2, ...) { z <- x + y; list(z, ...) }),
                  global_fun(function() 42),
                  # (a function defined in a function: a call holding its formals, a pairlist)
                  eval(no_src("function(xs) vapply(xs, function(x) x^2, 0)"), globalenv()),
                  no_src("function(x, y = 2) x + y"), as.pairlist(list(a = 1, 2)),
                  list("e", quote(sq(i)), list(), list(sq = global_fun(function(x) x * x),
                                                       i = 3L)))
  for (v in compact) {
    b <- .Call(mizu:::wrap__codec_encode, v)
    expect_identical(rawToChar(b[1]), "K", label = deparse(v)[1])
    expect_identical(.Call(mizu:::wrap__codec_decode, b), v, label = deparse(v)[1])
  }
  latin1 <- iconv("caf\u00e9", "UTF-8", "latin1")
  expect_identical(Encoding(.Call(mizu:::wrap__codec_roundtrip, latin1)), "latin1")
  # large plain vectors go out of band beside a compact body, inside named lists too
  big <- runif(1000)
  for (v in list(big, list(a = big, b = 1L, c = list(big)), list(x = as.raw(1:200)[rep(1, 5000)]))) {
    b <- .Call(mizu:::wrap__codec_encode, v)
    expect_identical(rawToChar(b[1]), "k", label = deparse(v)[1])
    expect_identical(.Call(mizu:::wrap__codec_decode, b), v, label = deparse(v)[1])
  }
  # everything else takes R's serialization
  other <- list(factor("a"), Sys.Date(), function(x) x, new.env(), 1:3, quote(function(x) x),
                matrix(1:4, 2), structure(1, foo = "bar"), list(runif(1000), 1:3),
                compiler::cmpfun(global_fun(function(x) x + 1)),
                # (a value keeps its functions' source; a task's message does not)
                eval(parse(text = "function(x) x - 1", keep.source = TRUE)[[1]], globalenv()))
  for (v in other) {
    b <- .Call(mizu:::wrap__codec_encode, v)
    expect_true(rawToChar(b[1]) %in% c("R", "r"), label = deparse(v)[1])
    r <- .Call(mizu:::wrap__codec_decode, b)
    if (is.environment(v)) {
      expect_true(is.environment(r))
    } else if (is.function(v)) {
      expect_identical(deparse(r), deparse(v))
    } else {
      expect_equal(r, v)
    }
  }
})

test_that("views nobody uses any more are released (their shared memory with them)", {
  live <- function() .Call(mizu:::wrap__view_live)[1]
  with_pool(1, function(pool) {
    invisible(gc())
    base <- live()
    keep <- lapply(1:5, function(i) mizu_collect(mizu_submit(pool, runif(1e5))))
    expect_equal(live(), base + 5)
    expect_true(all(vapply(keep, mizu_is_shared, TRUE)))
    rm(keep)
    invisible(gc())
    expect_equal(live(), base)
    # the worker releases the views of its inputs too
    x <- runif(1e5)
    for (i in 1:5) mizu_collect(mizu_submit(pool, sum(x), x = x))
    expect_equal(mizu_collect(mizu_submit(pool, { invisible(gc()); .Call(mizu:::wrap__view_live)[1] })), 0)
  })
})

test_that("long character vectors arrive as views that make their strings when read", {
  x <- c(rep(c("a", NA, "\u00e9t\u00e9", "", "a longer string"), 400),
         iconv("caf\u00e9", "UTF-8", "latin1"))
  names(x) <- paste0("n", seq_along(x))
  with_pool(1, function(pool) {
    v <- mizu_collect(mizu_submit(pool, y, y = x))
    expect_true(mizu_is_view(v))
    expect_true(mizu_is_shared(v))
    expect_identical(v, x)
    expect_identical(Encoding(v[2001]), "latin1")
    expect_identical(v[2], c(n2 = NA_character_))
    expect_identical(sort(unique(v[1:5])), sort(unique(x[1:5])))
    # sent on unmodified: the same bytes again, a view again
    w <- mizu_collect(mizu_submit(pool, y, y = v))
    expect_true(mizu_is_view(w))
    expect_identical(w, x)
    # modifying makes a private copy; the view it came from is unchanged
    v2 <- v
    v2[1] <- "changed"
    expect_false(mizu_is_shared(v2))
    expect_identical(v2[[1]], "changed")
    expect_identical(v[[1]], "a")
    expect_identical(v2[-1], x[-1])
    # data frame columns of strings too; short vectors travel inline
    df <- data.frame(s = rep(letters, 400), n = seq_len(10400))
    d2 <- mizu_collect(mizu_submit(pool, d, d = df))
    expect_identical(d2, df)
    expect_true(mizu_is_view(d2$s))
    expect_false(mizu_is_view(mizu_collect(mizu_submit(pool, c("a", "b")))))
  })
  # a NUL inside a string is refused before any string is made: in R's layout (Latin-1
  # strings keep it), and in an Arrow array (UTF-8 strings)
  b <- .Call(mizu:::wrap__codec_encode, rep(iconv("caf\u00e9", "UTF-8", "latin1"), 600))
  bad <- b
  bad[length(b) - 1] <- as.raw(0)
  expect_error(.Call(mizu:::wrap__codec_decode, bad), "malformed")
  b <- .Call(mizu:::wrap__codec_encode, rep("abc", 600))
  bad <- b
  at <- grepRaw(charToRaw("abcabc"), b)
  expect_true(length(at) == 1)
  bad[at + 1] <- as.raw(0)
  expect_error(.Call(mizu:::wrap__codec_decode, bad), "NUL")
})

test_that("an unmodified view sent on crosses by reference, not by copy", {
  size <- function(x) .Call(mizu:::wrap__codec_size, x)
  p1 <- mizu_pool(2)
  v <- mizu_collect(mizu_submit(p1, runif(1e6)))
  s <- mizu_collect(mizu_submit(p1, rep(letters, 1000)))
  expect_lt(size(v), 1000)                  # a region descriptor, not 8 MB
  expect_lt(size(s), 1000)
  expect_lt(size(list(a = v, b = s, c = 1)), 2000)
  r <- mizu_collect(mizu_submit(p1, list(sum(x), length(y), mizu_is_view(x), x, y),
                                x = v, y = s))
  expect_identical(r[[1]], sum(v))
  expect_identical(r[[2]], 26000L)
  expect_true(r[[3]])
  expect_identical(r[[4]], v)
  expect_identical(r[[5]], s)
  # a third process gets it through a second: the same region each time
  r2 <- mizu_collect(mizu_submit(p1, mizu::mizu_collect(mizu::mizu_submit(
    mizu::mizu_current_pool(), sum(z), z = x)), x = v))
  expect_identical(r2, sum(v))
  v2 <- v
  v2[1] <- 0                                # modified: copied
  expect_gt(size(v2), 8e6)
  mizu_pool_stop(p1)
  # the producer is gone and its segments with it: sent on by copy, still intact
  expect_gt(size(v), 8e6)
  with_pool(1, function(p2) expect_identical(mizu_collect(mizu_submit(p2, x, x = v)), v))
})

test_that("abandoned and cancelled tasks give back the regions their payloads refer to", {
  # A task whose result is the worker's view of our 8 MB input refers to our region by
  # reference; dropping the task uncollected (or cancelling one whose input is a view) must
  # release that reference, or each such task pins 8 MB of shared memory until the pool stops.
  shm_mb <- function() {
    f <- list.files("/dev/shm", pattern = "^mizu_", full.names = TRUE)
    sum(file.size(f), na.rm = TRUE) / 2^20
  }
  with_pool(1, function(pool) {
    x <- as.double(seq_len(1e6))
    v <- mizu_collect(mizu_submit(pool, x, x = x))     # a view of the worker's copy
    round <- function() {
      for (i in 1:30) {
        t <- mizu_submit(pool, x, x = x)               # result: a reference to our region
        u <- mizu_submit(pool, Sys.sleep(0.01))
        w <- mizu_submit(pool, sum(v), v = v)          # input: a reference, then cancelled
        mizu_cancel(w)
        rm(t, u, w)
        invisible(gc())
      }
      mizu_collect(mizu_submit(pool, 1))               # the worker is past all of them
      invisible(gc())
    }
    round()
    after_one <- shm_mb()
    round()
    round()
    # Without the release: +480 MB (60 tasks x 8 MB); segments reused: a few at most.
    expect_lt(shm_mb() - after_one, 64)
    expect_identical(mizu_collect(mizu_submit(pool, sum(v), v = v)), sum(x))
  })
})

test_that("the shared memory of a one-off large transfer goes back after a pause", {
  # /dev/shm is RAM: the segments a large transfer needed are given back once unused for a
  # couple of seconds (in the caller and in the worker), not kept until the pool stops.
  shm_mb <- function(pids) {
    pat <- sprintf("^mizu_(%s)_", paste(sprintf("%x", as.integer(pids)), collapse = "|"))
    f <- list.files("/dev/shm", pattern = pat, full.names = TRUE)
    sum(file.size(f), na.rm = TRUE) / 2^20
  }
  with_pool(1, function(pool) {
    pids <- c(Sys.getpid(), mizu_pool_status(pool)$pid)
    before <- shm_mb(pids)
    mb <- big_mb()
    x <- as.double(seq_len(mb * 2^20 / 8))             # 100 MB: a region of ours
    y <- mizu_collect(mizu_submit(pool, x * 2, x = x))  # 100 MB: a region of the worker's
    expect_identical(y[length(y)], 2 * x[length(x)])
    # Both 100 MB regions are held now; ours may sit in an idle segment an earlier test left
    # (part of `before`), the new worker's cannot.
    expect_gte(shm_mb(pids), 1.9 * mb)
    expect_gte(shm_mb(pids) - before, 0.9 * mb)
    rm(x, y)
    invisible(gc())
    deadline <- Sys.time() + 120                       # a hang guard only
    while (shm_mb(pids) > before + 1 && Sys.time() < deadline) Sys.sleep(0.1)
    expect_lte(shm_mb(pids) - before, 1)
    z <- runif(2e6)                                    # the pool goes on working
    expect_identical(mizu_collect(mizu_submit(pool, z, z = z)), z)
  })
})

test_that("a worker killed while holding an input gives it back", {
  # The worker holds a view of our 80 MB vector when it is killed (execution timeout; a crash
  # or kill -9 is the same): the pool gives back what the dead worker's ledger lists, or our
  # segment stays until this process exits.
  shm_mb <- function() {
    f <- list.files("/dev/shm", pattern = sprintf("^mizu_%x_", Sys.getpid()), full.names = TRUE)
    sum(file.size(f), na.rm = TRUE) / 2^20
  }
  with_pool(1, exec_timeout = 1, function(pool) {
    before <- shm_mb()
    mb <- 0.8 * big_mb()
    x <- as.double(seq_len(mb * 2^20 / 8))
    t <- mizu_submit(pool, { Sys.sleep(60); length(x) }, x = x)
    expect_error(mizu_collect(t), class = "mizu_error_exec_timeout")
    expect_gte(shm_mb(), 0.95 * mb)                    # the 80 MB vector is held
    rm(x, t)
    invisible(gc())
    deadline <- Sys.time() + 120                       # a hang guard only
    while (shm_mb() > before + 1 && Sys.time() < deadline) Sys.sleep(0.1)
    expect_lte(shm_mb() - before, 1)
    expect_equal(mizu_collect(mizu_submit(pool, sum(y), y = runif(1e6) * 0 + 1)), 1e6)
  })
})

test_that("a forked child dropping a view does not give back the parent's memory", {
  # mclapply/mcparallel children hold copies of the parent's views, not references of their
  # own: a child collecting one must not release the parent's region (which the parent's next
  # value would then overwrite).
  with_pool(1, function(pool) {
    x <- as.double(seq_len(1e6))
    v <- mizu_collect(mizu_submit(pool, x, x = x))     # a view of our region
    mizu_collect(mizu_submit(pool, invisible(gc())))   # the worker lets go of its view
    job <- parallel::mcparallel({ rm(v); invisible(gc()); TRUE })
    expect_true(parallel::mccollect(job)[[1]])
    w <- mizu_collect(mizu_submit(pool, z, z = rep(7, 1e6)))
    expect_identical(v, x)
    expect_identical(w[[1]], 7)
  })
})

# The benchmark's data-frame round trip in a loop (R code for `run_r`): prints "same TRUE".
df_loop <- c(
  "nr <- 54000L",
  "df <- data.frame(a = runif(nr), b = rnorm(nr), c = seq_len(nr),",
  "                 e = factor(sample(letters[1:5], nr, TRUE)), f = runif(nr), g = rnorm(nr),",
  "                 h = sample(1000L, nr, TRUE), j = runif(nr), k = runif(nr), l = runif(nr))",
  "add_col <- function(d) { d$m <- d$a + d$c; d }",
  "for (i in 1:60) r <- mizu_collect(mizu_submit(pool, f(d), f = add_col, d = df))",
  "cat('same', identical(r, add_col(df)), '\n')"
)

test_that("a small /dev/shm carries a data-frame loop and a full one fails clearly", {
  # A container's /dev/shm is 64 MiB by default (MIZU_SHM_BYTES makes mizu behave so here).
  # The benchmark's data-frame round trip in a loop failed after five rounds (16 MiB segments
  # in three processes), with a garbled error ("unknown tag 0x6d": the runtime's text read as
  # a payload).
  files <- list.files("/dev/shm", "^mizu_", full.names = TRUE)
  limit <- sum(file.size(files), na.rm = TRUE) + 64 * 2^20
  out <- run_r(c(
    sprintf('Sys.setenv(MIZU_SHM_BYTES = "%.0f", MIZU_SPILL_DIR = "none")', limit),
    "library(mizu)",
    "pool <- mizu_pool(2)",
    df_loop,
    "e <- tryCatch(mizu_collect(mizu_submit(pool, length(x), x = runif(1e7))), error = identity)",
    "cat('class', class(e)[1], '\n')",
    "cat('message', conditionMessage(e), '\n')",
    # A result too large for what is left fails the task with the runtime's text.
    "e <- tryCatch(mizu_collect(mizu_submit(pool, runif(1e7))), error = identity)",
    "cat('made', class(e)[1], grepl('cannot store the result', conditionMessage(e)), '\n')",
    "cat('after', mizu_collect(mizu_submit(pool, 1 + 1)), '\n')",
    # Tasks dropped uncollected whose results reference 8 MB each: their batch of handles
    # held them all (64 MiB after eight) until /dev/shm was full; now it is let go then.
    "x <- runif(1e6)",
    "for (i in 1:20) { t <- mizu_submit(pool, x, x = x); Sys.sleep(0.02); rm(t) }",
    "cat('dropped', mizu_collect(mizu_submit(pool, sum(x), x = x)) == sum(x), '\n')",
    "mizu_pool_stop(pool)"
  ), timeout = 300)
  expect_true("dropped TRUE " %in% out, info = paste(out, collapse = "\n"))
  expect_true("same TRUE " %in% out, info = paste(out, collapse = "\n"))
  expect_true("class mizu_error " %in% out, info = paste(out, collapse = "\n"))
  msg <- grep("^message ", out, value = TRUE)
  expect_match(msg, "no room in /dev/shm", fixed = TRUE)
  expect_match(msg, "--shm-size", fixed = TRUE)
  expect_true("made mizu_error TRUE " %in% out, info = paste(out, collapse = "\n"))
  expect_true("after 2 " %in% out, info = paste(out, collapse = "\n"))
})

test_that("values too big for a small /dev/shm spill to files, said once", {
  # A 200 MB vector through a 64 MiB /dev/shm (a container's default; MIZU_SHM_BYTES makes mizu
  # behave so here): it goes to files in the spill directory, there and back, shared or not;
  # the first spill warns once, naming how to enlarge /dev/shm; nothing is left behind.
  files <- list.files("/dev/shm", "^mizu_", full.names = TRUE)
  limit <- sum(file.size(files), na.rm = TRUE) + 64 * 2^20
  spill <- tempfile("spill")
  dir.create(spill)
  on.exit(unlink(spill, recursive = TRUE))
  out <- run_r(c(
    sprintf('Sys.setenv(MIZU_SHM_BYTES = "%.0f", MIZU_SPILL_DIR = "%s")', limit, spill),
    "library(mizu)",
    "pool <- mizu_pool(1)",
    "x <- runif(2.5e7)",
    "r <- mizu_collect(mizu_submit(pool, v, v = x))",
    "cat('back', identical(r, x), '\n')",
    "y <- x * 2",
    "r2 <- mizu_collect(mizu_submit(pool, v[1:3], v = y))",
    "cat('again', identical(r2, y[1:3]), '\n')",
    "s <- mizu_share(x)",
    "cat('shared', identical(mizu_collect(mizu_submit(pool, sum(v), v = s)), sum(x)), '\n')",
    "rm(r, s); invisible(gc())",
    "mizu_pool_stop(pool)"
  ), timeout = 300)
  expect_true("back TRUE " %in% out, info = paste(out, collapse = "\n"))
  expect_true("again TRUE " %in% out, info = paste(out, collapse = "\n"))
  expect_true("shared TRUE " %in% out, info = paste(out, collapse = "\n"))
  # The first spill is said once, as a warning at the top level (`mizu: /dev/shm ... has no
  # room ...`), with how to enlarge /dev/shm.
  said <- grep("has no room for a value", out, fixed = TRUE, value = TRUE)
  expect_length(said, 1)
  expect_match(said, "--shm-size", fixed = TRUE)
  expect_length(list.files(spill), 0)
})

test_that("a worker short of /dev/shm gets the room the caller's garbage views hold", {
  # The caller waits for a result while the views of earlier results, garbage R has not
  # collected (it knows nothing of their size), fill /dev/shm: the worker storing this result
  # finds no room. A caller whose wait outlasts a slice under such pressure collects them.
  files <- list.files("/dev/shm", "^mizu_", full.names = TRUE)
  limit <- sum(file.size(files), na.rm = TRUE) + 40 * 2^20
  out <- run_r(c(
    sprintf('Sys.setenv(MIZU_SHM_BYTES = "%.0f", MIZU_SPILL_DIR = "none")', limit),
    "library(mizu)",
    "pool <- mizu_pool(2)",
    df_loop,
    "mizu_pool_stop(pool)"
  ), timeout = 300)
  expect_true("same TRUE " %in% out, info = paste(out, collapse = "\n"))
})

test_that("the same vector twice in a value travels once and arrives as one view", {
  x <- runif(1e5)
  size <- function(v) .Call(mizu:::wrap__codec_size, v)
  expect_lt(size(list(a = x, b = x)), size(list(a = x, b = x + 0)) * 0.6)
  with_pool(1, function(pool) {
    r <- mizu_collect(mizu_submit(pool, list(a = x, b = x), x = x))
    expect_identical(r, list(a = x, b = x))
  })
})

python_or_skip <- function() {
  py <- Sys.getenv("MIZU_PYTHON")
  if (!nzchar(py)) {
    if (in_ci()) fail("MIZU_PYTHON must name a Python with pymizu and pyarrow in CI")
    skip("MIZU_PYTHON not set (cargo xtask test sets it)")
  }
  py
}

run_python <- function(py, code, ...) {
  f <- tempfile(fileext = ".py")
  on.exit(unlink(f))
  writeLines(code, f)
  suppressWarnings(system2(py, c(f, ...), stdout = TRUE, stderr = TRUE))
}

test_that("large vectors travel as Arrow arrays that Python reads as they are", {
  py <- python_or_skip()
  n <- 3000L
  tokyo <- as.POSIXct("2024-01-01", tz = "Asia/Tokyo")
  x <- list(
    int = c(NA, seq_len(n)),
    dbl = c(1.5, NA, NaN, seq_len(n) / 4),
    lgl = rep_len(c(TRUE, FALSE, NA), n),
    fct = factor(c("b", NA, rep_len(c("a", "b", "\u00e9"), n)), levels = c("a", "b", "\u00e9")),
    ord = factor(rep_len(c("lo", "hi"), n), levels = c("lo", "hi"), ordered = TRUE),
    date = as.Date("2024-02-29") + c(NA, seq_len(n)),
    time = tokyo + c(0.25, NA, seq_len(n)),
    i64 = structure(readBin(writeBin(rep(c(7L, 0L), n), raw()), "double", n),
                    class = "integer64"),
    raw = as.raw(seq_len(5000) %% 256),
    frac = structure(c(0.5, seq_len(n)), class = "Date"),
    subus = .POSIXct(c(1e-7, seq_len(n)), tz = "UTC"),
    cplx = complex(real = seq_len(n), imaginary = 1),
    chr = c(NA, rep_len(c("\u00e9t\u00e9", "b"), n)),
    latin1 = rep(iconv("caf\u00e9", "UTF-8", "latin1"), n)
  )
  frames <- .Call(mizu:::wrap__codec_arrow_frames, x)
  expect_length(frames, length(x) - 2L)   # complex and Latin-1 strings keep R's layout
  d <- tempfile()
  dir.create(d)
  on.exit(unlink(d, recursive = TRUE))
  for (k in seq_along(frames)) writeBin(frames[[k]], file.path(d, sprintf("%02d.frame", k)))
  out <- run_python(py, c(
    "import glob, json, os, sys",
    "import pyarrow as pa",
    "import pymizu.wire as w",
    "for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.frame'))):",
    "    a, _ = w.loads(open(f, 'rb').read())",
    "    fld, arr = pa.field(a), pa.array(a)",
    "    meta = ';'.join(f'{k.decode()}={v.decode()}' for k, v in sorted((fld.metadata or {}).items()))",
    "    if pa.types.is_dictionary(arr.type):",
    "        vals = arr.dictionary.to_pylist() + arr.indices[:3].to_pylist()",
    "    elif pa.types.is_date32(arr.type):",
    "        vals = arr[:3].cast(pa.int32()).to_pylist()",
    "    elif pa.types.is_timestamp(arr.type):",
    "        vals = arr[:3].cast(pa.int64()).to_pylist()",
    "    else:",
    "        vals = arr[:3].to_pylist()",
    "    print(f'{fld.type}|{meta}|{arr.null_count}|{json.dumps(vals)}')"
  ), d)
  us <- function(t) sprintf("%.0f", as.numeric(t) * 1e6)
  expect_identical(out[1:10], c(
    "int32||1|[null, 1, 2]",
    "double||1|[1.5, null, NaN]",
    "bool||1000|[true, false, null]",
    "dictionary<values=string, indices=int32, ordered=0>|mizu.r.class=factor|1|[\"a\", \"b\", \"\\u00e9\", 1, null, 0]",
    "dictionary<values=string, indices=int32, ordered=1>|mizu.r.class=ordered|0|[\"lo\", \"hi\", 0, 1, 0]",
    "date32[day]||1|[null, 19783, 19784]",
    sprintf("timestamp[us, tz=Asia/Tokyo]|mizu.r.tz=Asia/Tokyo|1|[%s, null, %s]",
            us(tokyo + 0.25), us(tokyo + 1)),
    "int64|mizu.r.class=integer64|0|[7, 7, 7]",
    "uint8||0|[1, 2, 3]",
    "double||0|[0.5, 1.0, 2.0]"                     # not whole days: the doubles as they are
  ))
  expect_match(out[11], "^double\\|\\|0\\|")      # a sub-microsecond time: likewise
  expect_identical(out[12], "string||1|[null, \"\\u00e9t\\u00e9\", \"b\"]")
  # and R still gets every one back exactly
  with_pool(1, function(pool) expect_identical(roundtrip(pool, x), x))
})

test_that("Arrow arrays written by Python arrive as the R vectors they mean", {
  py <- python_or_skip()
  d <- tempfile()
  dir.create(d)
  on.exit(unlink(d, recursive = TRUE))
  out <- run_python(py, c(
    "import datetime as dt, os, sys",
    "import pyarrow as pa",
    "import pymizu.wire as w",
    "arrays = [",
    "    pa.array([1, None, 3], pa.int32()),",
    "    pa.array([1.5, None, float('nan')]),",
    "    pa.array([True, None, False]),",
    "    pa.array([dt.date(2024, 2, 29), None]),",
    "    pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 500000), None], pa.timestamp('us', tz='UTC')),",
    "    pa.array(['b', None, 'a', 'b']).dictionary_encode(),",
    "    pa.array([5, None], pa.int64()),",
    "    pa.array([1, 2, 255], pa.uint8()),",
    "    pa.array(range(10), pa.int32()).slice(3, 4),",
    "    pa.array([1, 2], pa.int8()),",
    "    pa.array(['x', None, '\u00e9t\u00e9']),",
    "    pa.array(['a\\x00b']),",
    "    pa.array(['p', None, 'q', 'rs'], pa.large_string()).slice(1, 3),",
    "]",
    "for k, a in enumerate(arrays):",
    "    open(os.path.join(sys.argv[1], f'{k:02d}.frame'), 'wb').write(w.dumps(a))",
    "print('ok')"
  ), d)
  expect_identical(out, "ok")
  read <- function(k) {
    f <- file.path(d, sprintf("%02d.frame", k))
    .Call(mizu:::wrap__codec_arrow_read, readBin(f, "raw", file.size(f)))
  }
  expect_identical(read(0), c(1L, NA, 3L))           # nulls over 0s: NA
  v <- read(1)
  expect_identical(v[1], 1.5)
  expect_true(is.na(v[2]) && !is.nan(v[2]))         # a null is NA, a NaN stays NaN
  expect_true(is.nan(v[3]))
  expect_identical(read(2), c(TRUE, NA, FALSE))
  expect_identical(read(3), c(as.numeric(as.Date("2024-02-29")), NA))
  expect_identical(read(4), c(as.numeric(as.POSIXct("2024-01-01", tz = "UTC")) + 0.5, NA))
  expect_identical(read(5), c(1L, NA, 2L, 1L))       # dictionary codes, 1-based
  expect_identical(read(6), c(readBin(writeBin(c(5L, 0L), raw()), "double"), NA))
  expect_identical(read(7), as.raw(c(1, 2, 255)))
  expect_identical(read(8), 3:6)                     # a slice: its own elements only
  expect_error(read(9), "Int8 has no R mapping", class = "error")
  s <- read(10)
  expect_identical(s, c("x", NA, "\u00e9t\u00e9"))
  expect_identical(Encoding(s[3]), "UTF-8")
  expect_error(read(11), "NUL")
  expect_identical(read(12), c(NA, "q", "rs"))        # large_utf8, sliced
})

test_that("logical, factor, Date and POSIXct vectors arrive as lazy views of shared pages", {
  size <- function(x) .Call(mizu:::wrap__codec_size, x)
  n <- 20000L
  x <- list(l = rep_len(c(TRUE, NA, FALSE), n), f = factor(rep_len(c("x", NA, "y"), n)),
            d = as.Date("2020-01-01") + seq_len(n),
            t = as.POSIXct("2020-01-01", tz = "UTC") + seq_len(n) / 4)
  p1 <- mizu_pool(1)
  on.exit(mizu_pool_stop(p1))
  got <- mizu_collect(mizu_submit(p1, x, x = x))
  for (nm in names(x)) {
    v <- got[[nm]]
    expect_true(mizu_is_view(v), label = nm)
    expect_identical(v[c(1, 2, n)], x[[nm]][c(1, 2, n)])
    expect_identical(attributes(v), attributes(x[[nm]]))
    expect_true(mizu_is_shared(v), label = nm)      # reading converts element by element
    expect_lt(size(v), 1000)                        # unmodified: sent on by reference
  }
  expect_identical(sum(got$l, na.rm = TRUE), sum(x$l, na.rm = TRUE))
  expect_identical(table(got$f), table(x$f))
  f <- tempfile()
  saveRDS(got, f)                                   # written as ordinary vectors
  expect_identical(readRDS(f), x)
  unlink(f)
  # the worker gets them by reference and reads the same values
  expect_identical(
    mizu_collect(mizu_submit(p1, list(sum(l, na.rm = TRUE), levels(f), as.integer(f)[1:3],
                                      format(d[1]), as.numeric(t[2]), mizu::mizu_is_view(t)),
                             l = got$l, f = got$f, d = got$d, t = got$t)),
    list(sum(x$l, na.rm = TRUE), levels(x$f), as.integer(x$f)[1:3], format(x$d[1]),
         as.numeric(x$t[2]), TRUE))
  # modifying one gives a private copy; the shared pages are untouched
  got$l[2] <- TRUE
  expect_false(mizu_is_shared(got$l))
  expect_identical(got$l[1:3], c(TRUE, TRUE, FALSE))
  expect_identical(mizu_collect(mizu_submit(p1, l[1:3], l = got$l)), c(TRUE, TRUE, FALSE))
  again <- mizu_collect(mizu_submit(p1, x$l[1:3], x = x))
  expect_identical(again, c(TRUE, NA, FALSE))
})

test_that("a data frame travels as one Arrow record batch that Python reads as a table", {
  py <- python_or_skip()
  n <- 2000L
  df <- data.frame(i = c(NA, seq_len(n - 1L)), x = c(0.5, NA, seq_len(n - 2L) / 2),
                   l = rep_len(c(TRUE, NA, FALSE), n),
                   f = factor(rep_len(c("lo", "hi", NA), n), levels = c("lo", "hi")),
                   d = as.Date("2020-02-02") + seq_len(n),
                   t = as.POSIXct("2020-01-01", tz = "UTC") + seq_len(n),
                   s = rep_len(c("x", NA, "\u00e9"), n))
  frames <- .Call(mizu:::wrap__codec_arrow_frames, df)
  expect_length(frames, 1L)                         # one record batch, not six arrays
  f <- tempfile(fileext = ".frame")
  on.exit(unlink(f))
  writeBin(frames[[1]], f)
  out <- run_python(py, c(
    "import sys",
    "import pyarrow as pa",
    "import pymizu.wire as w",
    "t, _ = w.loads(open(sys.argv[1], 'rb').read())",
    "t = pa.table(t)",
    "print(t.num_rows, t.schema.metadata[b'mizu.r.class'].decode())",
    "for c in t.schema:",
    "    print(c.name, c.type, t[c.name].null_count)",
    "print(t['f'].to_pylist()[:3], t['x'].to_pylist()[:2], t['i'].to_pylist()[:2])"
  ), f)
  expect_identical(out, c(
    "2000 data.frame",
    "i int32 1",
    "x double 1",
    "l bool 667",
    "f dictionary<values=string, indices=int32, ordered=0> 666",
    "d date32[day] 0",
    "t timestamp[us, tz=UTC] 0",
    "s string 667",
    "['lo', 'hi', None] [0.5, None] [None, 1]"
  ))
})

test_that("data frame columns keep their own attributes and travel back by reference", {
  size <- function(x) .Call(mizu:::wrap__codec_size, x)
  n <- 30000L
  df <- data.frame(a = runif(n), b = seq_len(n), f = factor(rep_len(c("x", "y"), n)),
                   d = as.Date("2021-06-01") + seq_len(n))
  attr(df$a, "label") <- "a label"
  attr(df, "note") <- "kept"
  with_pool(1, function(pool) {
    got <- roundtrip(pool, df)
    # (checked before anything takes a writable pointer, which copies a view)
    expect_true(all(vapply(got, mizu_is_shared, NA)))
    expect_lt(size(got), 2000)                  # every column by reference
    expect_identical(got, df)
    # the worker adds a column: the others come back by reference, the new one by copy
    got <- roundtrip(pool, df)
    r <- mizu_collect(mizu_submit(pool, { d$k <- d$a * 2; d }, d = got))
    expect_true(mizu_is_shared(r$f))
    expect_lt(size(r[c("a", "b", "f", "d")]), 2000)
    expected <- df
    expected$k <- df$a * 2
    expect_identical(r, expected)
    # a column sent alone, and two data frames sharing columns
    got <- roundtrip(pool, df)
    expect_identical(mizu_collect(mizu_submit(pool, as.vector(table(f)), f = got$f)),
                     as.vector(table(df$f)))
    both <- mizu_collect(mizu_submit(pool, list(d1, d2), d1 = got, d2 = got[c("b", "d")]))
    expect_identical(both, list(df, df[c("b", "d")]))
  })
})

test_that("data frames with columns Arrow does not map travel column by column", {
  n <- 5000L
  frames <- list(
    cplx = data.frame(z = complex(real = seq_len(n), imaginary = 1), x = runif(n)),
    lst = local({ d <- data.frame(x = seq_len(n)); d$l <- as.list(seq_len(n)); d }),
    dup = data.frame(x = runif(n), y = runif(n))[c(1, 2, 1)],
    small = data.frame(x = 1:3, y = c("a", "b", "c"))
  )
  with_pool(1, function(pool) {
    for (nm in names(frames)) {
      expect_identical(roundtrip(pool, frames[[nm]]), frames[[nm]], label = nm)
    }
  })
  expect_length(.Call(mizu:::wrap__codec_arrow_frames, frames$cplx), 1L)   # x alone
})

test_that("lazy views behave as the vectors they stand for in everyday operations", {
  n <- 6000L
  x <- list(l = rep_len(c(TRUE, NA, FALSE, FALSE), n),
            f = factor(rep_len(c("b", "a", NA, "c"), n), levels = c("c", "b", "a")),
            o = factor(rep_len(c("lo", "hi"), n), levels = c("lo", "hi"), ordered = TRUE),
            d = as.Date("2024-01-01") + c(NA, seq_len(n - 1L)),
            t = as.POSIXct("2024-01-01", tz = "Europe/Paris") + seq_len(n) * 60)
  with_pool(1, function(pool) {
    got <- roundtrip(pool, x)
    for (nm in names(x)) {
      v <- got[[nm]]
      w <- x[[nm]]
      expect_true(mizu_is_view(v), label = nm)
      expect_identical(v[1:5], w[1:5], label = nm)
      expect_identical(head(v, 3), head(w, 3), label = nm)
      expect_identical(rev(v)[1:3], rev(w)[1:3], label = nm)
      expect_identical(is.na(v), is.na(w), label = nm)
      expect_identical(sort(v), sort(w), label = nm)
      expect_identical(unique(v), unique(w), label = nm)
      expect_identical(v[c(TRUE, FALSE)], w[c(TRUE, FALSE)], label = nm)
      expect_identical(format(v[2:4]), format(w[2:4]), label = nm)
      expect_identical(v == v[2], w == w[2], label = nm)
    }
    expect_identical(sum(got$l, na.rm = TRUE), sum(x$l, na.rm = TRUE))
    expect_identical(which(got$l), which(x$l))
    expect_identical(ifelse(got$l, 1, 0), ifelse(x$l, 1, 0))
    expect_identical(as.integer(got$f), as.integer(x$f))
    expect_identical(levels(droplevels(got$f[1:2])), levels(droplevels(x$f[1:2])))
    expect_identical(got$o[1] < got$o[2], x$o[1] < x$o[2])
    expect_identical(as.numeric(got$d), as.numeric(x$d))
    expect_identical(diff(got$t[1:3]), diff(x$t[1:3]))
    expect_identical(format(got$t[1], "%H:%M %Z"), format(x$t[1], "%H:%M %Z"))
    expect_identical(split(seq_len(n), got$f), split(seq_len(n), x$f))
  })
})

test_that("the serialization check lets every kind of R object through", {
  rt <- function(x) .Call(mizu:::wrap__codec_roundtrip, x)
  setClass("MizuPt", representation(x = "numeric", y = "character"), where = globalenv())
  on.exit(removeClass("MizuPt", where = globalenv()))
  e <- new.env()
  assign("a", 1, e)
  lockBinding("a", e)
  lockEnvironment(e)
  vals <- list(
    s4 = new("MizuPt", x = 1:3 + 0.5, y = "a"),
    compiled = compiler::cmpfun(function(a, ...) { b <- list(...); a + length(b) }),
    formula = stats::as.formula("y ~ x + log(z)", env = globalenv()),
    call = quote(foo(bar, baz = 1L)[[2]]$x),
    sequences = list(a = 1:10, b = seq_len(5000)), pointer = list(p = new("externalptr")),
    nested = list(list(list(1, "a", NULL, NA))), factor_na = factor(c("a", NA), exclude = NULL),
    list_column = data.frame(a = 1:3, b = I(list(1, 2:3, "x"))),
    expression = expression(a + 1, b * 2), namespace_fun = stats::median
  )
  for (nm in names(vals)) {
    got <- rt(vals[[nm]])
    if (is.function(vals[[nm]])) expect_identical(got(1, 2, 3), vals[[nm]](1, 2, 3), label = nm)
    else expect_equal(got, vals[[nm]], label = nm)
  }
  m <- lm(mpg ~ wt, mtcars)
  expect_equal(predict(rt(m), mtcars[1:3, ]), predict(m, mtcars[1:3, ]))
  got <- rt(list(env = e, ns = asNamespace("stats"), g = globalenv()))
  expect_identical(get("a", got$env), 1)
  expect_true(bindingIsLocked("a", got$env))
  expect_identical(got$ns, asNamespace("stats"))
  expect_identical(got$g, globalenv())
})

test_that("a large vector sent again unchanged goes by reference to a kept copy", {
  written <- function() .Call(mizu:::wrap__payload_bytes_written)
  p <- mizu_pool(1)
  big <- runif(2e5)                                   # 1.6 MB
  expect_identical(mizu_collect(mizu_submit(p, x, x = big)), big)
  before <- written()
  expect_identical(mizu_collect(mizu_submit(p, sum(x), x = big)), sum(big))
  expect_lt(written() - before, 4096)                 # a region descriptor, not 1.6 MB
  # changed in place (one reference: R modifies it where it is): copied anew, never stale
  big[7] <- -1
  expect_identical(mizu_collect(mizu_submit(p, x[7], x = big)), -1)
  expect_identical(mizu_collect(mizu_submit(p, x, x = big)), big)
  ints <- sample.int(100L, 5e5, TRUE)
  expect_identical(mizu_collect(mizu_submit(p, x, x = ints)), ints)
  expect_identical(mizu_collect(mizu_submit(p, x, x = ints)), ints)
})
