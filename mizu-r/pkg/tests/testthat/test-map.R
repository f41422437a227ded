test_that("maps return results in order with names; .ptype gives a typed vector", {
  with_pool(2, function(pool) {
    x <- stats::setNames(1:50, paste0("e", 1:50))
    expect_identical(mizu_map(pool, x, function(i, k) i * k, k = 2L), as.list(x * 2L))
    expect_identical(mizu_map(pool, x, function(i) i / 2, .ptype = double()), x / 2)
    expect_identical(mizu_map(pool, 1:5, function(i) i %% 2 == 0, .ptype = logical()),
                     c(FALSE, TRUE, FALSE, TRUE, FALSE))
    expect_identical(mizu_map(pool, 1:3, function(i) letters[i], .ptype = character()),
                     letters[1:3])
    expect_identical(mizu_map(pool, list(), identity), list())
    expect_identical(mizu_map(pool, integer(), identity, .ptype = double()), double())
    expect_identical(mizu_map(pool, 1:3, function(i) NULL), list(NULL, NULL, NULL))
    expect_identical(mizu_map(pool, 1:10, sqrt, .chunk_size = 3), as.list(sqrt(1:10)))
    expect_error(mizu_map(pool, 1:3, function(i) c(i, i), .ptype = double()),
                 "one double value")
    expect_error(mizu_map(pool, 1:3, identity, .ptype = 1), "ptype")
    expect_error(mizu_map(pool, 1:3, identity, .seed = -1), "seed")
  })
})

test_that("large typed maps are written by the workers straight into one shared vector", {
  with_pool(2, function(pool) {
    n <- 20000L
    x <- stats::setNames(seq_len(n), paste0("e", seq_len(n)))
    d <- mizu_map(pool, x, function(i) i / 4, .ptype = double())
    # A view of the shared output (checked before anything reads it: R's own code may ask a
    # view for a writable pointer, which makes a private copy).
    expect_true(mizu_is_shared(d))
    expect_identical(names(d)[c(1, n)], c("e1", paste0("e", n)))
    expect_identical(unname(d), seq_len(n) / 4)
    i <- mizu_map(pool, seq_len(n), function(i) if (i %% 7L == 0L) NA_integer_ else -i,
                  .ptype = integer(), .chunk_size = 999)
    expect_true(mizu_is_shared(i))
    expect_identical(i, ifelse(seq_len(n) %% 7L == 0L, NA_integer_, -seq_len(n)))
    l <- mizu_map(pool, seq_len(n), function(i) if (i == 3L) NA else i %% 2L == 0L,
                  .ptype = logical())
    expect_identical(l, replace(seq_len(n) %% 2L == 0L, 3L, NA))
    r <- mizu_map(pool, seq_len(n), function(i) as.raw(i %% 256L), .ptype = raw())
    expect_identical(r, as.raw(seq_len(n) %% 256L))
    z <- mizu_map(pool, seq_len(2000), function(i) complex(real = i, imaginary = -i),
                  .ptype = complex())
    expect_identical(z, complex(real = 1:2000, imaginary = -(1:2000)))
    # Numbers of another numeric type are converted, as for small maps.
    expect_identical(mizu_map(pool, seq_len(n), function(i) i, .ptype = double()),
                     as.double(seq_len(n)))
    # The output is sent on by reference: a worker reads the same shared pages.
    s <- mizu_map(pool, seq_len(n), function(i) i * 1, .ptype = double())
    expect_identical(mizu_collect(mizu_submit(pool, c(sum(v), mizu::mizu_is_shared(v)), v = s)),
                     c(sum(as.double(seq_len(n))), 1))
    # A failing element stops the map as for any other map; the pool goes on.
    e <- tryCatch(mizu_map(pool, seq_len(n), function(i) if (i == 12345L) stop("no") else i,
                           .ptype = integer()), error = function(e) e)
    expect_equal(e$index, 12345)
    expect_error(mizu_map(pool, seq_len(n), function(i) "a", .ptype = double()),
                 "one double value")
    # Nested: a task maps over the pool into its own worker's shared output.
    v <- mizu_collect(mizu_submit(pool, {
      out <- mizu::mizu_map(mizu::mizu_current_pool(), seq_len(5000), function(i) i * 3,
                            .ptype = double())
      c(mizu::mizu_is_shared(out), sum(out))
    }))
    expect_identical(v, c(1, sum(seq_len(5000) * 3)))
  })
})

test_that("a map of more chunks than workers sends its function compiled", {
  # Otherwise R's JIT compiles the closure again in every chunk, on the workers' time.
  with_pool(2, function(pool) {
    f <- function(i) .Call(mizu:::wrap__is_compiled, sys.function())
    expect_true(all(unlist(mizu_map(pool, 1:40, f, .chunk_size = 1))))
    expect_false(.Call(mizu:::wrap__is_compiled, f))  # the caller's closure is left as it is
    expect_identical(mizu_map(pool, 1:40, function(i) i * 2, .chunk_size = 3), as.list(1:40 * 2))
  })
})

test_that("a worker keeps a map's function for its chunks, and only for that map", {
  # The function travels serialized once per map; each worker unserializes it once.
  with_pool(1, function(pool) {
    expect_identical(unlist(mizu_map(pool, 1:20, function(i) i, .chunk_size = 2)), 1:20)
    expect_identical(unlist(mizu_map(pool, 1:20, function(i) -i, .chunk_size = 2)), -(1:20))
    make <- function(k) function(i) i * k
    expect_identical(unlist(mizu_map(pool, 1:6, make(3L), .chunk_size = 2)), (1:6) * 3L)
    expect_identical(unlist(mizu_map(pool, 1:6, make(4L), .chunk_size = 2)), (1:6) * 4L)
    # State a function keeps in its environment lasts for one map on a worker, never into
    # the next map, even of the same function sent as the same bytes (its environment's
    # parent is the global environment, which is not serialized).
    counter <- local({ n <- 0L; function(i) { n <<- n + 1L; n } },
                     envir = new.env(parent = globalenv()))
    first <- unlist(mizu_map(pool, 1:4, counter, .chunk_size = 2))
    expect_identical(first, 1:4)  # one worker: the map's two chunks share its function
    expect_identical(unlist(mizu_map(pool, 1:4, counter, .chunk_size = 2)), first)
  })
})

test_that("each element reaches .f as lapply passes it, whatever the vector, and so do the extras", {
  with_pool(2, function(pool) {
    # Plain vectors travel in slices, classed ones as lists: the elements are the same.
    for (x in list(c(a = 1.5, b = 2, c = NA), c("x", NA, "z"), as.raw(1:3), c(1i, 2i),
                   matrix(1:6, 2), factor(c("u", "v", "u")), as.Date("2024-01-01") + 0:2,
                   list(1, "a", NULL))) {
      expect_identical(mizu_map(pool, x, function(e) list(e, class(e))),
                       lapply(x, function(e) list(e, class(e))))
    }
    # Slices of several elements each, of every kind of vector, a compact sequence and a
    # pairlist among them.
    for (x in list(c(TRUE, NA, FALSE, TRUE, FALSE, NA, TRUE), seq_len(50), 1:50 + 0.5,
                   complex(real = 1:9, imaginary = -1), as.raw(0:20), letters,
                   as.list(1:25), pairlist(1, "b", 3, NULL, 5))) {
      expect_identical(mizu_map(pool, x, function(e) list(e, class(e)), .chunk_size = 3),
                       lapply(x, function(e) list(e, class(e))))
    }
    # An extra argument that is a call or a symbol arrives as it is, not evaluated.
    expect_identical(mizu_map(pool, 1:3, function(i, e, s) list(e, s), e = quote(a + b),
                              s = as.name("zz")),
                     rep(list(list(quote(a + b), as.name("zz"))), 3))
    # Extras with and without names are matched as lapply matches them, also through `...`.
    g <- function(x, a, ...) list(x, a, ...length(), list(...))
    big <- as.numeric(1:100000)
    expect_identical(mizu_map(pool, 1:6, g, 10, b = "k", NULL, big),
                     lapply(1:6, g, 10, b = "k", NULL, big))
    expect_identical(mizu_map(pool, 1:4, function(x, y = 2) x * y), lapply(1:4, function(x, y = 2) x * y))
    # An error `.f` handles itself is no failure, and the next failing element is the one
    # reported.
    f <- function(i) {
      r <- tryCatch(stop("inner"), error = function(e) -i)
      if (i == 7L) stop("outer ", i)
      r
    }
    expect_identical(mizu_map(pool, 1:5, f), as.list(-(1:5)))
    e <- tryCatch(mizu_map(pool, 1:9, f), error = function(e) e)
    expect_equal(conditionMessage(e), "outer 7")
    expect_equal(e$index, 7)
  })
})

test_that("warnings of a map's elements reach the caller and the values keep their places", {
  with_pool(2, function(pool) {
    f <- function(i) {
      if (i %% 25 == 0) warning(paste("element", i))
      if (i %% 7 == 0) NULL else i
    }
    want <- lapply(1:100, function(i) if (i %% 7 == 0) NULL else i)
    for (progress in c(FALSE, TRUE)) {
      seen <- character(0)
      capture.output(got <- withCallingHandlers(
        mizu_map(pool, 1:100, f, .progress = progress),
        warning = function(w) {
          seen <<- c(seen, conditionMessage(w))
          invokeRestart("muffleWarning")
        }))
      expect_identical(got, want)
      expect_setequal(seen, paste("element", c(25, 50, 75, 100)))
    }
  })
})

test_that("a chunk's function lasts through a nested map that replaces the one its worker keeps", {
  # One worker: the map's second chunk runs with the function the worker kept from the first;
  # element 4 then runs a nested map (whose chunks this worker runs too, keeping that map's
  # function instead) and a full collection, and elements 5 and 6 call the outer function
  # again.
  with_pool(1, function(pool) {
    f <- function(i) {
      inner <- if (i == 4) {
        r <- mizu::mizu_map(mizu::mizu_current_pool(), 1:4, function(j) j * 10,
                            .chunk_size = 1)
        gc(full = TRUE)
        sum(unlist(r))
      } else {
        0
      }
      c(i, inner)
    }
    r <- mizu_map(pool, 1:6, f, .chunk_size = 3)
    expect_equal(r, list(c(1, 0), c(2, 0), c(3, 0), c(4, 100), c(5, 0), c(6, 0)))
    expect_equal(mizu_map(pool, 1:6, f, .chunk_size = 3), r)
  })
})

test_that("a failing element's position survives the nested maps its chunk runs", {
  with_pool(1, function(pool) {
    f <- function(i) {
      p <- mizu::mizu_current_pool()
      inner <- mizu::mizu_map(p, 1:6, function(j) j * 2, .chunk_size = 2)
      caught <- tryCatch(mizu::mizu_map(p, 1:3, function(j) stop("inner")),
                         error = function(e) e$index)
      if (i == 5) stop("outer five")
      sum(unlist(inner)) + caught
    }
    e <- tryCatch(mizu_map(pool, 1:8, f, .chunk_size = 8), error = function(e) e)
    expect_equal(conditionMessage(e), "outer five")
    expect_equal(e$index, 5)
    expect_identical(mizu_map(pool, 1:3, function(i) f(1), .chunk_size = 3), as.list(rep(43, 3)))
  })
})

test_that("the first failing element by position is reported, with its class and index", {
  with_pool(2, function(pool) {
    f <- function(i) if (i %in% c(37, 80)) stop(structure(
      class = c("odd_error", "error", "condition"),
      list(message = paste("bad", i), call = NULL))) else i
    e <- tryCatch(mizu_map(pool, 1:100, f), error = function(e) e)
    expect_s3_class(e, "odd_error")
    expect_equal(conditionMessage(e), "bad 37")
    expect_equal(e$index, 37)
    # the pool is still usable afterwards
    expect_identical(mizu_map(pool, 1:4, function(i) -i), as.list(-(1:4)))
  })
})

test_that("seeded maps are identical for any worker count and chunking", {
  f <- function(i) c(runif(2), rnorm(1), sample(100, 1))
  r1 <- with_pool(1, function(p) mizu_map(p, 1:40, f, .seed = 2024))
  r2 <- with_pool(2, function(p) mizu_map(p, 1:40, f, .seed = 2024, .chunk_size = 3))
  r3 <- with_pool(2, function(p) mizu_map(p, 1:40, f, .seed = 2024))
  expect_identical(r1, r2)
  expect_identical(r1, r3)
  expect_false(identical(r1[[1]], r1[[2]]))
  r4 <- with_pool(1, function(p) mizu_map(p, 1:40, f, .seed = 2025))
  expect_false(identical(r1, r4))
  # runif in element i is the documented stream
  u <- with_pool(1, function(p) mizu_map(p, 1:3, function(i) runif(4), .seed = 7))
  for (i in 1:3) expect_identical(u[[i]], mizu_stream(7, i, 4))
})

test_that("the caller's and the workers' RNG state is left as it was", {
  set.seed(1)
  before <- .Random.seed
  with_pool(1, function(p) {
    mizu_map(p, 1:3, function(i) runif(1), .seed = 3)
    w <- mizu_collect(mizu_submit(p, { set.seed(5); a <- runif(1); list(a, RNGkind()[1]) }))
    mizu_map(p, 1:3, function(i) runif(1), .seed = 3)
    w2 <- mizu_collect(mizu_submit(p, { set.seed(5); list(runif(1), RNGkind()[1]) }))
    expect_identical(w, w2)
    expect_equal(w[[2]], "Mersenne-Twister")
  })
  expect_identical(.Random.seed, before)
})

test_that("runif in a seeded element equals numpy's Philox stream", {
  py <- Sys.getenv("MIZU_PYTHON")
  if (!nzchar(py)) {
    if (in_ci()) fail("MIZU_PYTHON must name a Python with numpy in CI")
    skip("MIZU_PYTHON not set (cargo xtask test sets it)")
  }
  u <- with_pool(2, function(p) mizu_map(p, 1:5, function(i) runif(3), .seed = 123456789))
  code <- paste0(
    "import numpy as np\n",
    "for i in range(5):\n",
    "    g = np.random.Generator(np.random.Philox(key=123456789, counter=i << 128))\n",
    "    print(' '.join(repr(float(v)) for v in g.random(3)))\n")
  f <- tempfile(fileext = ".py")
  writeLines(code, f)
  out <- system2(py, f, stdout = TRUE)
  unlink(f)
  expect_length(out, 5)
  for (i in 1:5) {
    expect_identical(u[[i]], as.numeric(strsplit(out[[i]], " ")[[1]]))
  }
})

test_that("nested maps and submits from inside tasks do not deadlock with one worker", {
  with_pool(1, function(pool) {
    r <- mizu_collect(mizu_submit(pool, {
      inner <- mizu::mizu_current_pool()
      level2 <- mizu::mizu_map(inner, 1:3, function(i) {
        p <- mizu::mizu_current_pool()
        sum(unlist(mizu::mizu_map(p, 1:i, function(j) j * 10)))
      })
      t <- mizu::mizu_submit(inner, 5 + 5)
      list(unlist(level2), mizu::mizu_collect(t))
    }))
    expect_identical(r, list(c(10, 30, 60), 10))
    # Waiting for any of them runs them too; and more in flight than a worker's own task
    # slots (256) wait for room by running them.
    first <- mizu_collect(mizu_submit(pool, {
      inner <- mizu::mizu_current_pool()
      mizu::mizu_collect_any(lapply(1:3, function(i) mizu::mizu_submit(inner, i * 2, i = i)))
    }), timeout = 120)
    expect_true(first[[2]] %in% c(2, 4, 6))
    many <- mizu_collect(mizu_submit(pool, {
      inner <- mizu::mizu_current_pool()
      ts <- lapply(1:1000, function(i) mizu::mizu_submit(inner, i, i = i))
      sum(unlist(mizu::mizu_collect_all(ts)))
    }), timeout = 120)
    expect_identical(many, sum(1:1000))
    # A search's cancelled leftovers do not clog the worker's queues: rounds of 100 nested
    # tasks, all but a few cancelled while queued, then more submissions.
    searched <- mizu_collect(mizu_submit(pool, {
      inner <- mizu::mizu_current_pool()
      cancelled <- 0
      for (round in 1:20) {
        ts <- lapply(1:100, function(i) mizu::mizu_submit(inner, i, i = i))
        mizu::mizu_collect_any(ts)
        cancelled <- cancelled + sum(vapply(ts, mizu::mizu_cancel, TRUE))
      }
      more <- lapply(1:40, function(i) mizu::mizu_collect(mizu::mizu_submit(inner, i, i = i)))
      c(cancelled, sum(unlist(more)))
    }), timeout = 120)
    expect_gt(searched[[1]], 20 * 90)
    expect_identical(searched[[2]], as.numeric(sum(1:40)))
    seeded <- mizu_collect(mizu_submit(pool, mizu::mizu_map(mizu::mizu_current_pool(), 1:3,
                                                            function(i) runif(1), .seed = 9)))
    expect_identical(unlist(seeded), vapply(1:3, function(i) mizu_stream(9, i, 1), 0))
  })
})

test_that("progress is shown when asked", {
  with_pool(1, function(pool) {
    out <- capture.output(r <- mizu_map(pool, 1:20, identity, .progress = TRUE))
    expect_true(any(grepl("100%", out)))
    expect_identical(r, as.list(1:20))
  })
})

test_that("a map's output is written only through a view of it that arrived by reference", {
  # Chunk tasks hold a counted reference to the output area through that view, so its space
  # is never reused under a chunk still writing; a copy of the view (or a view of another
  # area) is refused rather than written into.
  with_pool(1, function(pool) {
    o <- .Call(mizu:::wrap__out_new, pool, double(), 1000)
    spec <- o[[2]]
    copy <- spec[[1]]
    copy[1] <- copy[1]                                 # a private copy of the view
    expect_error(.Call(mizu:::wrap__out_write, list(copy, spec[[2]]), 1, c(1, 2)),
                 "did not arrive by reference")
    other <- .Call(mizu:::wrap__out_new, pool, double(), 1000)
    expect_error(.Call(mizu:::wrap__out_write, list(other[[2]][[1]], spec[[2]]), 1, c(1, 2)),
                 "did not arrive by reference")
    expect_null(.Call(mizu:::wrap__out_write, spec, 3, c(1.5, 2.5)))
    expect_identical(.Call(mizu:::wrap__out_view, o[[1]])[3:4], c(1.5, 2.5))
    # Through a worker, as a map does it.
    expect_null(mizu_collect(mizu_submit(pool, .Call(mizu:::wrap__out_write, s, 10, c(7, 8)),
                                         s = spec)))
    expect_identical(.Call(mizu:::wrap__out_view, o[[1]])[10:11], c(7, 8))
  })
})

test_that("a map's function finds the global variables and functions it uses, as future finds them", {
  ge <- globalenv()
  on.exit(rm(list = c("mizu_t_k", "mizu_t_g", "mizu_t_f", "mizu_t_big", "mizu_t_env",
                      "mizu_t_make"), envir = ge))
  # Defined at top level, as a script or the console would.
  eval(quote({
    mizu_t_k <- 3
    mizu_t_big <- as.numeric(seq_len(300000))   # 2.4 MB: shared once for the map
    mizu_t_g <- function(x) x * mizu_t_k
    mizu_t_f <- function(i) mizu_t_g(i) + mizu_t_big[[i]]
    mizu_t_make <- function(off) function(i) i + off + mizu_t_k
  }), ge)
  with_pool(2, function(pool) {
    want <- lapply(1:40, function(i) i * 3 + i)
    expect_identical(mizu_map(pool, 1:40, ge$mizu_t_f), want)
    expect_identical(mizu_map(pool, 1:40, ge$mizu_t_f, .chunk_size = 1), want)
    # An inline function in the global environment, and a closure made by a global function
    # (its own environment travels with it; the global it reaches through it does not).
    inline <- eval(quote(function(i) mizu_t_k - i), ge)
    expect_identical(mizu_map(pool, 1:3, inline), list(2, 1, 0))
    expect_identical(mizu_map(pool, 1:3, ge$mizu_t_make(10)), list(14, 15, 16))
    # The values of this map, not of an earlier one.
    assign("mizu_t_k", 5, envir = ge)
    expect_identical(mizu_map(pool, 1:2, inline), list(4, 3))
    # Nothing is left behind on the workers.
    left <- mizu_map(pool, 1:4, function(i) exists("mizu_t_k", envir = globalenv()))
    expect_identical(unique(unlist(left)), FALSE)
    # A global that cannot be sent is named.
    assign("mizu_t_env", new.env(), envir = ge)
    uses_env <- eval(quote(function(i) get("a", envir = mizu_t_env)), ge)
    expect_error(mizu_map(pool, 1:2, uses_env), "global `mizu_t_env`: an environment",
                 class = "mizu_error_not_portable")
  })
})

test_that("a task missing a variable says how to pass it", {
  with_pool(1, function(pool) {
    e <- tryCatch(mizu_collect(mizu_submit(pool, mizu_t_nowhere + 1)), error = identity)
    expect_s3_class(e, "mizu_error_task")
    expect_match(conditionMessage(e), "object 'mizu_t_nowhere' not found on the worker")
    expect_match(conditionMessage(e), "mizu_t_nowhere = mizu_t_nowhere")
  })
})

test_that("the packages a task uses reach the workers, as future attaches them", {
  # `tools` is installed with R and attached by no worker at start. (Left as it was found.)
  had_tools <- "package:tools" %in% search()
  library(tools)
  on.exit(if (!had_tools) detach("package:tools"), add = TRUE)
  ext <- function(f) file_ext(f)  # a global function using the package
  assign("mizu_t_ext", ext, envir = globalenv())
  on.exit(rm("mizu_t_ext", envir = globalenv()), add = TRUE)
  with_pool(2, function(pool) {
    expect_identical(mizu_collect(mizu_submit(pool, file_ext("a.txt"))), "txt")
    expect_identical(mizu_collect(mizu_submit(pool, mizu_t_ext("b.csv"))), "csv")
    expect_identical(unlist(mizu_map(pool, c("a.R", "b.md", "c"), function(f) file_ext(f))),
                     c("R", "md", ""))
    expect_identical(unlist(mizu_map(pool, c("a.R", "b.md"), mizu_t_ext, .chunk_size = 1)),
                     c("R", "md"))
    ts <- mizu_submit_batch(pool, list(quote(file_ext("x.tar")), quote(mizu_t_ext("y.gz"))))
    expect_identical(mizu_collect_all(ts), list("tar", "gz"))
    # Attached where they ran, in the search path's usual place.
    where <- unlist(mizu_map(pool, 1:4, function(i) match("package:tools", search()),
                             .chunk_size = 1))
    expect_true(all(where == 2L))
  })
  # A package the session attaches after a first task is found at the next submit.
  with_pool(1, function(pool) {
    detach("package:tools")
    e <- tryCatch(mizu_collect(mizu_submit(pool, file_ext("a.txt"))), error = identity)
    expect_match(conditionMessage(e), "could not find function \"file_ext\"")
    library(tools)
    expect_identical(mizu_collect(mizu_submit(pool, file_ext("a.txt"))), "txt")
  })
})

test_that("a worker's search path follows the caller's: what an earlier task attached masks nothing", {
  # purrr and data.table both export `transpose`; each task must get the one the session has.
  had <- intersect(c("package:purrr", "package:data.table"), search())
  on.exit({
    for (p in setdiff(intersect(c("package:purrr", "package:data.table"), search()), had))
      detach(p, character.only = TRUE)
  }, add = TRUE)
  for (p in had) detach(p, character.only = TRUE)
  l <- list(1:2, 3:4)
  with_pool(1, function(pool) {
    suppressMessages(library(purrr))
    expect_identical(mizu_collect(mizu_submit(pool, transpose(l), l = l)), transpose(l))
    detach("package:purrr")
    suppressMessages(library(data.table))
    expect_identical(mizu_collect(mizu_submit(pool, transpose(l), l = l)), transpose(l))
    detach("package:data.table")
    suppressMessages(library(purrr))
    # purrr was attached on the worker first, data.table after it, for the tasks above.
    expect_identical(mizu_collect(mizu_submit(pool, transpose(l), l = l)), transpose(l))
    expect_false("package:data.table" %in% mizu_collect(mizu_submit(pool, { map; search() })))
    # Both, in either order.
    suppressMessages(library(data.table))
    expect_identical(mizu_collect(mizu_submit(pool, transpose(l), l = l)), transpose(l))
    detach("package:purrr")
    suppressMessages(library(purrr))
    expect_identical(mizu_collect(mizu_submit(pool, transpose(l), l = l)), transpose(l))
    expect_identical(unlist(mizu_map(pool, 1:2, function(i) length(transpose(l)[[i]]))),
                     vapply(1:2, function(i) length(transpose(l)[[i]]), 1L))
  })
})

test_that("a task missing what an attached package has names the package and how to attach it", {
  # (An environment attached as a package: what library() makes, without a real package.)
  attach(list(mizu_t_pkg_obj = 1, mizu_t_pkg_fn = function(x) x), name = "package:mizutpkg")
  on.exit(detach("package:mizutpkg"), add = TRUE)
  had_tools <- "package:tools" %in% search()
  library(tools)
  on.exit(if (!had_tools) detach("package:tools"), add = TRUE)
  with_pool(1, function(pool) {
    not_installed <- "in package:mizutpkg, attached in this session \\(not an installed package"
    e <- tryCatch(mizu_collect(mizu_submit(pool, mizu_t_pkg_obj + 1)), error = identity)
    expect_s3_class(e, "mizu_error_task")
    expect_match(conditionMessage(e), "object 'mizu_t_pkg_obj' not found on the worker")
    expect_match(conditionMessage(e), not_installed)
    expect_match(conditionMessage(e), "mizu_t_pkg_obj = mizu_t_pkg_obj", fixed = TRUE)
    e <- tryCatch(mizu_map(pool, 1:3, function(i) mizu_t_pkg_fn(i)), error = identity)
    expect_s3_class(e, "mizu_error_task")
    expect_match(conditionMessage(e), "function \"mizu_t_pkg_fn\" not found on the worker")
    expect_match(conditionMessage(e), not_installed)
    expect_identical(e$index, 1L)
    # As it says, passed with the task it runs.
    expect_identical(mizu_collect(mizu_submit(pool, mizu_t_pkg_obj + 1,
                                              mizu_t_pkg_obj = mizu_t_pkg_obj)), 2)
    # An installed package's name the task reaches where its code does not name it: library().
    e <- tryCatch(mizu_collect(mizu_submit(pool, get("file_ext")("a.txt"))), error = identity)
    expect_match(conditionMessage(e), paste0(
      "object 'file_ext' not found on the worker: it is package tools's, attached in this ",
      "session but not in the workers.*library\\(tools\\)"))
  })
})

test_that("a task's expression finds the variables and functions it uses, as future finds them", {
  ge <- globalenv()
  on.exit(rm(list = c("mizu_t_k", "mizu_t_g", "mizu_t_f", "mizu_t_env", "mizu_t_pool",
                      "mizu_t_list", "mizu_t_make", "mizu_t_h", "mizu_t_sq", "mizu_t_fib",
                      "mizu_t_src", "mizu_t_def"),
             envir = ge))
  eval(quote({
    mizu_t_k <- 3
    mizu_t_g <- function(x) x * mizu_t_k
    mizu_t_f <- function(x) mizu_t_g(x) + 1
    mizu_t_make <- function(off) function(x) x + off + mizu_t_k
    mizu_t_h <- mizu_t_make(10)
    mizu_t_sq <- function(x, p = 2, ...) x^p + mizu_t_k + length(list(...))
    mizu_t_fib <- function(n) if (n < 2) n else mizu_t_fib(n - 1) + mizu_t_fib(n - 2)
  }), ge)
  with_pool(2, function(pool) {
    # Top-level variables and global functions calling other globals (submitted from the
    # global environment, as a script would).
    assign("mizu_t_pool", pool, envir = ge)
    top <- function(e) mizu_collect(eval(e, ge))
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_k * 2))), 6)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_f(2)))), 7)
    # A global function made by another: its maker's frame travels with it, and the global
    # variable it reaches through that frame is found too.
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_h(1)))), 14)
    # Functions without a srcref, as a script run by Rscript makes them (they travel in the
    # compact encoding): defaults, `...`, a global variable, and one that calls itself.
    assign("mizu_t_sq", utils::removeSource(mizu_t_sq), envir = ge)
    assign("mizu_t_fib", utils::removeSource(mizu_t_fib), envir = ge)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_sq(3, 1, "a")))), 7)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_sq(3)))), 12)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_fib(10)))), 55)
    # Functions that keep their source, as R's console and RStudio make them (a task's
    # functions travel without it), one of them defining a function in its body.
    src <- function(text) eval(parse(text = text, keep.source = TRUE)[[1]], ge)
    assign("mizu_t_src", src("function(x) {\n  # doubled\n  x * 2 + mizu_t_k\n}"), envir = ge)
    assign("mizu_t_def", src("function(x) { g <- function(y) y - 1; g(x) }"), envir = ge)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_src(4)))), 11)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_def(4)))), 3)
    back <- mizu_collect(mizu_submit(pool, f, f = ge$mizu_t_src))
    expect_equal(back(1), 5)
    expect_null(attr(back, "srcref"))
    # A binding given with the task wins over a global of the same name.
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_k * 2, mizu_t_k = 10))), 20)
    # Variables of the calling function's frame, and of the frames around it.
    outer <- function(a) {
      inner <- function(b) mizu_collect(mizu_submit(pool, a * 100 + b + mizu_t_k))
      inner(2)
    }
    expect_equal(outer(1), 105)
    local({
      v <- 7
      expect_equal(mizu_collect(mizu_submit(pool, v + 1)), 8)
    })
    # Batches find them too, and names that are not variables are not taken for globals.
    got <- eval(quote(mizu_collect_all(mizu_submit_batch(mizu_t_pool, list(
      quote(mizu_t_g(mizu_t_k)), quote(stats::median(c(1, mizu_t_k, 5))),
      quote(data.frame(a = mizu_t_k)$a))))), ge)
    expect_equal(got, list(9, 3, 3))
    # A variable defined inside the task is its own; a base function stays the worker's.
    sum <- function(...) "not this one"
    expect_equal(mizu_collect(mizu_submit(pool, { z <- 4; base::sum(z, 1) })), 5)
    # The worker keeps nothing after the task.
    expect_false(mizu_collect(mizu_submit(pool, exists("mizu_t_k", envir = globalenv()))))
    # A global that cannot be sent is named.
    assign("mizu_t_env", new.env(), envir = ge)
    expect_error(eval(quote(mizu_submit(mizu_t_pool, get("a", envir = mizu_t_env))), ge),
                 "global `mizu_t_env`: an environment", class = "mizu_error_not_portable")
    assign("mizu_t_list", list(a = 1, b = new.env()), envir = ge)
    expect_error(eval(quote(mizu_submit(mizu_t_pool, mizu_t_list$a)), ge),
                 "global `mizu_t_list`\\$b: an environment", class = "mizu_error_not_portable")
  })
})

test_that("a task's globals replace the worker's own while it runs, which come back after", {
  ge <- globalenv()
  on.exit(rm(list = c("mizu_t_n", "mizu_t_even", "mizu_t_odd", "mizu_t_null", "mizu_t_pool"),
             envir = ge))
  eval(quote({
    # Global functions calling each other: with them, the task's globals are bound in the
    # worker's global environment while it runs.
    mizu_t_even <- function(n) if (n == 0) TRUE else mizu_t_odd(n - 1)
    mizu_t_odd <- function(n) if (n == 0) FALSE else mizu_t_even(n - 1)
    mizu_t_n <- 7
    mizu_t_null <- NULL
  }), ge)
  with_pool(1, function(pool) {
    assign("mizu_t_pool", pool, envir = ge)
    top <- function(e) mizu_collect(eval(e, ge))
    worker_n <- function() mizu_collect(mizu_submit(pool, get("mizu_t_n", envir = globalenv())))
    expect_false(top(quote(mizu_submit(mizu_t_pool, mizu_t_even(mizu_t_n)))))
    # A global whose value is NULL travels as one, with or without global functions.
    expect_true(top(quote(mizu_submit(mizu_t_pool, is.null(mizu_t_null)))))
    expect_true(top(quote(mizu_submit(mizu_t_pool, is.null(mizu_t_null) && mizu_t_even(0)))))
    # The worker's own globals of those names (a value, and an unforced promise) are replaced
    # while the task runs and put back after, the promise still unforced; names the worker
    # did not have are gone again.
    mizu_collect(mizu_submit(pool, {
      assign("mizu_t_n", "worker's", envir = globalenv())
      delayedAssign("mizu_t_odd", stop("forced"), assign.env = globalenv())
      NULL
    }))
    expect_false(top(quote(mizu_submit(mizu_t_pool, mizu_t_even(mizu_t_n)))))
    expect_identical(worker_n(), "worker's")
    expect_error(mizu_collect(mizu_submit(pool, get("mizu_t_odd", envir = globalenv()))),
                 "forced")
    expect_false(mizu_collect(mizu_submit(pool, exists("mizu_t_even", envir = globalenv()))))
    # So they do after a task that fails.
    expect_error(top(quote(mizu_submit(mizu_t_pool, mizu_t_even("a")))), "non-numeric")
    expect_identical(worker_n(), "worker's")
    expect_false(mizu_collect(mizu_submit(pool, exists("mizu_t_even", envir = globalenv()))))
    # A locked binding of the worker's is not replaced: the task fails, saying which, and
    # binds nothing.
    mizu_collect(mizu_submit(pool, lockBinding("mizu_t_n", globalenv())))
    expect_error(top(quote(mizu_submit(mizu_t_pool, mizu_t_even(mizu_t_n)))), "mizu_t_n.*locked")
    expect_identical(worker_n(), "worker's")
    expect_false(mizu_collect(mizu_submit(pool, exists("mizu_t_even", envir = globalenv()))))
  })
})

test_that("a function arrives whole even where the worker's global environment binds `function`", {
  ge <- globalenv()
  on.exit(rm("mizu_t_sq2", envir = ge))
  assign("mizu_t_sq2", utils::removeSource(eval(quote(function(x) x * x), ge)), envir = ge)
  with_pool(1, function(pool) {
    mizu_collect(mizu_submit(pool, assign("function", function(...) stop("not this one"),
                                          envir = globalenv())))
    expect_equal(eval(quote(mizu_collect(mizu_submit(pool, mizu_t_sq2(3)))), list(pool = pool), ge), 9)
  })
})

test_that("a worker makes a task's function once and keeps it; a task's change stays its own", {
  ge <- globalenv()
  on.exit(rm(list = c("mizu_t_cf", "mizu_t_pool"), envir = ge))
  # A function R compiled in the caller (cmpfun here; R's JIT after a few calls) travels as
  # its code, not as byte code.
  assign("mizu_t_cf", compiler::cmpfun(utils::removeSource(
    eval(quote(function(x, p = 2) { s <- 0; for (k in seq_len(p)) s <- s + x; s }), ge))),
    envir = ge)
  compiled <- quote(any(grepl("<bytecode", utils::capture.output(print(mizu_t_cf)))))
  expect_true(eval(compiled, ge))
  with_pool(1, function(pool) {
    assign("mizu_t_pool", pool, envir = ge)
    top <- function(e) mizu_collect(eval(e, ge))
    run <- function(e) top(bquote(mizu_submit(mizu_t_pool, .(e))))
    expect_false(run(compiled))
    expect_equal(run(quote(mizu_t_cf(3))), 6)
    # The same function in later tasks is the one the worker made first: the JIT compiled it
    # in place on its second call, and it stays compiled.
    expect_equal(run(quote(mizu_t_cf(4, 3))), 12)
    expect_true(run(compiled))
    # A task that changes the function changes its own copy.
    expect_equal(run(quote({ f <- mizu_t_cf; attr(f, "tag") <- "mine"; body(f) <- quote(-x)
                             f(1) })), -1)
    expect_null(run(quote(attr(mizu_t_cf, "tag"))))
    expect_equal(run(quote(mizu_t_cf(5))), 10)
    # Another function of the same name is another function.
    assign("mizu_t_cf", utils::removeSource(eval(quote(function(x, p = 2) x * 100), ge)),
           envir = ge)
    expect_equal(run(quote(mizu_t_cf(5))), 500)
  })
})

test_that("a function given with a task or a map finds its own globals, as R scopes them", {
  ge <- globalenv()
  on.exit(rm(list = c("mizu_t_k2", "mizu_t_g2", "mizu_t_pool"), envir = ge))
  eval(quote({
    mizu_t_k2 <- 10
    mizu_t_g2 <- function(x) x * mizu_t_k2
  }), ge)
  with_pool(1, function(pool) {
    assign("mizu_t_pool", pool, envir = ge)
    top <- function(e) mizu_collect(eval(e, ge))
    # A function given as a binding takes its globals along.
    expect_equal(top(quote(mizu_submit(mizu_t_pool, f(2), f = mizu_t_g2))), 20)
    expect_equal(mizu_collect(mizu_submit(pool, f(2), f = ge$mizu_t_g2)), 20)
    # A binding or a variable of the calling frame named like a function's global is the
    # expression's; the function still sees its own global, as it would in the caller.
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_g2(2) + mizu_t_k2, mizu_t_k2 = 5))),
                 25)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, f(2) + mizu_t_k2, f = mizu_t_g2,
                                       mizu_t_k2 = 1))), 21)
    caller <- function() {
      mizu_t_k2 <- 3
      mizu_collect(mizu_submit(pool, mizu_t_g2(2) + mizu_t_k2))
    }
    expect_equal(caller(), 23)
    expect_equal(local({ mizu_t_k2 <- 3; mizu_t_g2(2) + mizu_t_k2 }, new.env(parent = ge)), 23)
    # A function given to a map as an extra argument, too.
    expect_equal(mizu_map(pool, 1:3, function(i, f) f(i), f = ge$mizu_t_g2), list(10, 20, 30))
    expect_equal(mizu_map(pool, 1:3, function(i, f) f(i), f = ge$mizu_t_g2, .chunk_size = 1),
                 list(10, 20, 30))
    # The worker keeps none of them after.
    expect_false(mizu_collect(mizu_submit(pool, exists("mizu_t_k2", envir = globalenv()))))
  })
})

test_that("a global function that finds nothing in the global environment travels among the bindings", {
  ge <- globalenv()
  on.exit(rm(list = c("mizu_t_sq4", "mizu_t_g4", "mizu_t_free", "mizu_t_k4", "mizu_t_pool"),
             envir = ge))
  eval(quote({
    mizu_t_sq4 <- function(x) x * x
    mizu_t_g4 <- function(x) x * mizu_t_k4
    mizu_t_free <- function() mizu_t_x4
    mizu_t_k4 <- 2
  }), ge)
  msg <- function(e) mizu:::.expr_message(e, list(), ge)
  # The cheaper message: no globals bound in the worker's global environment for it ...
  m <- msg(quote(mizu_t_sq4(3) + mizu_t_k4))
  expect_length(m, 3)
  expect_setequal(names(m[[3]]), c("mizu_t_sq4", "mizu_t_k4"))
  # ... unlike a function that finds one there (its globals are a fourth element).
  m <- msg(quote(mizu_t_g4(3)))
  expect_length(m, 4)
  expect_setequal(names(m[[4]]), c("mizu_t_g4", "mizu_t_k4"))
  with_pool(1, function(pool) {
    assign("mizu_t_pool", pool, envir = ge)
    top <- function(e) mizu_collect(eval(e, ge))
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_sq4(3) + mizu_t_k4))), 11)
    expect_equal(top(quote(mizu_submit(mizu_t_pool, mizu_t_g4(3) + mizu_t_sq4(2)))), 10)
    # The function still looks its variables up from the global environment, as in the
    # caller: a binding of the task's is not one of its own.
    expect_error(mizu_t_free(), "mizu_t_x4")
    expect_error(top(quote(mizu_submit(mizu_t_pool, mizu_t_free(), mizu_t_x4 = 1))), "mizu_t_x4")
    expect_error(top(quote(mizu_submit(mizu_t_pool, mizu_t_free() + mizu_t_k4, mizu_t_x4 = 1))),
                 "mizu_t_x4")
    expect_false(mizu_collect(mizu_submit(pool, exists("mizu_t_sq4", envir = globalenv()))))
  })
})

test_that("a map of no more chunks than workers sends a global function as itself, a compiled one as byte code", {
  ge <- globalenv()
  on.exit(rm(list = c("mizu_t_cmp", "mizu_t_k5", "mizu_t_add"), envir = ge))
  eval(quote({
    mizu_t_k5 <- 10
    mizu_t_add <- function(i) i + mizu_t_k5
  }), ge)
  # A function the caller compiled runs compiled from a worker's first call of it.
  assign("mizu_t_cmp", compiler::cmpfun(
    eval(quote(function(i) .Call(mizu:::wrap__is_compiled, sys.function())), ge)), envir = ge)
  with_pool(2, function(pool) {
    expect_identical(unlist(mizu_map(pool, 1:2, ge$mizu_t_cmp)), c(TRUE, TRUE))
    # One sent as itself finds its globals, and the values of this map, not of an earlier one.
    expect_identical(mizu_map(pool, 1:2, ge$mizu_t_add), list(11, 12))
    assign("mizu_t_k5", 20, envir = ge)
    expect_identical(mizu_map(pool, 1:2, ge$mizu_t_add), list(21, 22))
    expect_identical(mizu_map(pool, 1:2, ge$mizu_t_add, .chunk_size = 2), list(21, 22))
  })
})
