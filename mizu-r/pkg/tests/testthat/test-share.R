# mizu_share(): copied into shared memory once, then sent by reference (checked by where the
# workers' views live, not by timings).

# Defined here, not inside a test: a closure made where a shared vector lives would carry
# that environment, and serializing it copies the vector (see docs/r.md).
region <- function(v) .Call(mizu:::wrap__view_region, v)
regions <- function(d) vapply(d, function(v) .Call(mizu:::wrap__view_region, v), "")
region_of_arg <- function(i, v) .Call(mizu:::wrap__view_region, v)

test_that("mizu_share returns the same value over shared memory", {
  x <- runif(1e5)
  s <- mizu_share(x)
  expect_true(mizu_is_shared(s))
  expect_false(is.null(region(s)))
  expect_equal(sum(s), sum(x))
  m <- mizu_share(matrix(as.double(1:20000), 100))
  expect_equal(dim(m), c(100L, 200L))
  expect_true(mizu_is_shared(m))
  small <- mizu_share(1:10)  # below 4 KiB: a plain copy
  expect_identical(small, 1:10)
  l <- mizu_share(list(a = runif(1e4), b = "x", c = letters))
  expect_true(mizu_is_shared(l$a))
  expect_identical(l$b, "x")
})

test_that("a shared vector sent to many tasks is never copied again", {
  with_pool(2, function(pool) {
    s <- mizu_share(runif(1e6))
    mine <- region(s)
    seen <- vapply(1:12, function(i) mizu_collect(mizu_submit(pool, where(v), v = s, where = region)), "")
    expect_identical(unique(seen), mine)
    expect_true(mizu_is_shared(s))
    got <- mizu_map(pool, 1:8, region_of_arg, v = s)
    expect_identical(unique(unlist(got)), mine)
  })
})

test_that("workers read each shared vector's own values, whatever they read before", {
  # Workers remember the layout of shared vectors they read (by region); vectors shared one
  # after another, of the same length and of other types, are each read as themselves.
  with_pool(1, function(pool) {
    read <- function(s) mizu_collect(mizu_submit(pool, c(v[[1L]], v[[length(v)]], sum(v)), v = s))
    for (k in 1:3) {
      x <- runif(5e4)
      s <- mizu_share(x)
      for (j in 1:3) expect_equal(read(s), c(x[[1L]], x[[5e4]], sum(x)))
      rm(s)
      invisible(gc())
      invisible(mizu_collect(mizu_submit(pool, invisible(gc()))))
    }
    i <- mizu_share(seq_len(5e4))
    expect_identical(mizu_collect(mizu_submit(pool, v[2:3], v = i)), 2:3)
    r <- mizu_share(as.raw(rep(7, 5e4)))
    expect_identical(mizu_collect(mizu_submit(pool, v[2:3], v = r)), as.raw(c(7, 7)))
    d <- mizu_share(as.double(seq_len(5e4)))
    expect_identical(mizu_collect(mizu_submit(pool, v[2:3], v = d)), c(2, 3))
  })
})

test_that("a map sends a large extra argument once, shared, for all its chunks", {
  with_pool(2, function(pool) {
    big <- runif(2e5)  # 1.6 MB, not shared by the caller
    got <- mizu_map(pool, 1:16, region_of_arg, v = big, .chunk_size = 2)
    expect_length(unique(unlist(got)), 1L)
    expect_false(mizu_is_view(big))
  })
})

test_that("a shared data frame reaches workers as views of the same memory", {
  with_pool(2, function(pool) {
    df <- mizu_share(data.frame(a = runif(1e5), b = seq_len(1e5)))
    expect_true(all(vapply(df, mizu_is_shared, NA)))
    mine <- regions(df)
    theirs <- mizu_collect(mizu_submit(pool, where(d), d = df, where = regions))
    expect_identical(theirs, mine)
    expect_equal(mizu_collect(mizu_submit(pool, sum(d$b), d = df)), sum(as.double(seq_len(1e5))))
  })
})

test_that("modifying a shared value gives a private copy and changes nothing others see", {
  x <- runif(1e5)
  s <- mizu_share(x)
  s2 <- s
  s2[1] <- -1
  expect_true(mizu_is_shared(s))
  expect_false(mizu_is_shared(s2))
  expect_identical(s[1], x[1])
  with_pool(1, function(pool) {
    expect_identical(mizu_collect(mizu_submit(pool, v[1], v = s)), x[1])
  })
})

test_that("Python workers read an R-shared vector in place", {
  with_pool(1, language = "python", function(pool) {
    s <- mizu_share(runif(1e5))
    got <- mizu_collect(mizu_submit(pool, mizu_call("pymizu._native.shared_region", s)))
    expect_identical(paste0(got[[1]], "+", got[[2]]), region(s))
  })
})

test_that("a worker reading one shared vector task after task does not collect for its views", {
  # Views of a region the worker already viewed since its last collection pin nothing more:
  # they do not count towards the bytes that make it collect (3 000 of them counted as 64 KiB
  # each made a collection every 2 048 tasks).
  with_pool(1, function(pool) {
    s <- mizu_share(runif(2e5))
    collections <- function() mizu_collect(mizu_submit(pool, .Call(mizu:::wrap__view_collections)))
    invisible(mizu_collect(mizu_submit(pool, v[[1L]], v = s)))
    before <- collections()
    for (i in 1:3000) mizu_collect(mizu_submit(pool, v[[1L]], v = s))
    expect_equal(collections(), before)
  })
})

test_that("a caller whose inputs come back by reference collects for them", {
  # The unmodified columns come back as views of the caller's own region, which nothing else
  # holds: they count at the region's size, or a loop of round trips would keep every task's
  # region until R happened to collect.
  with_pool(1, function(pool) {
    d <- data.frame(a = runif(2e5), b = runif(2e5))
    before <- .Call(mizu:::wrap__view_collections)
    for (i in 1:60) {
      r <- mizu_collect(mizu_submit(pool, { d$k <- 1; d }, d = d))
    }
    expect_identical(region(r$a), region(r$b))
    expect_gt(.Call(mizu:::wrap__view_collections), before)
  })
})

test_that("a caller given its shared vector back task after task does not collect for it", {
  # The share itself pins the region: only the first view since a collection counts.
  with_pool(1, function(pool) {
    s <- mizu_share(runif(2e5))
    invisible(mizu_collect(mizu_submit(pool, v, v = s)))
    before <- .Call(mizu:::wrap__view_collections)
    for (i in 1:2000) {
      r <- mizu_collect(mizu_submit(pool, v, v = s))
    }
    expect_identical(region(r), region(s))
    expect_equal(.Call(mizu:::wrap__view_collections), before)
  })
})
