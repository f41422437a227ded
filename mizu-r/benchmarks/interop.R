# The R half of mizu-py/benchmarks/interop.py: an R caller's trivial round trip to an R worker
# and to a Python worker (MIZU_PYTHON), and the per-element cost of a map of `sqrt` over
# 10 000 numbers on two workers of each, printed as `interop <name> <seconds>` lines.
#
#   Rscript mizu-r/benchmarks/interop.R [--quick]

suppressPackageStartupMessages(library(mizu))
quick <- "--quick" %in% commandArgs(trailingOnly = TRUE)
k <- if (quick) 1000L else 4000L
reps <- if (quick) 5L else 9L
now <- function() proc.time()[[3]]
per_op <- function(f) {
  f()
  median(vapply(seq_len(reps), function(i) { t0 <- now(); f(); now() - t0 }, 0)) / k
}
pool <- mizu_pool(1)
r_r <- per_op(function() for (i in seq_len(k)) mizu_collect(mizu_submit(pool, 1 + 1)))
mizu_pool_stop(pool)
pool <- mizu_pool(1, language = "python")
call <- mizu_call("operator.add", 1L, 1L)
r_py <- per_op(function() for (i in seq_len(k)) mizu_collect(mizu_submit(pool, call)))
mizu_pool_stop(pool)
xs <- as.numeric(seq_len(10000L))
per_element <- function(f) {
  f()
  median(vapply(seq_len(reps), function(i) { t0 <- now(); f(); now() - t0 }, 0)) / length(xs)
}
pool <- mizu_pool(2)
map_r_r <- per_element(function() mizu_map(pool, xs, sqrt))
mizu_pool_stop(pool)
pool <- mizu_pool(2, language = "python")
map_r_py <- per_element(function() mizu_map(pool, xs, "math.sqrt"))
mizu_pool_stop(pool)
cat(sprintf("interop r_r %.9f\ninterop r_py %.9f\ninterop map_r_r %.9f\ninterop map_r_py %.9f\n",
            r_r, r_py, map_r_r, map_r_py))
