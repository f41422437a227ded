# The R half of interop.py's split row: an R caller's trivial round trip (two workers, as in
# bench.R) and the part of it spent in R's own closure calls, printed as `split <name>
# <seconds>` lines. interop.py runs it in turns with Python's round trip, so that both see
# the machine in the same state.
#
#   Rscript mizu-r/benchmarks/split.R [--quick]

suppressPackageStartupMessages(library(mizu))
quick <- "--quick" %in% commandArgs(trailingOnly = TRUE)
n <- if (quick) 5000L else 20000L
now <- function() proc.time()[[3]]
pool <- mizu_pool(2)
rt <- function() for (i in seq_len(n)) mizu_collect(mizu_submit(pool, i, i = i))
# R's own part of the round trip (see shell.R).
source(file.path(dirname(sub("^--file=", "", grep("^--file=", commandArgs(FALSE), value = TRUE)[1])), "shell.R"))
shell <- function() for (i in seq_len(n)) shell_collect(shell_submit(pool, i, i = i))
rt()
shell()
# In turns, so that the machine's drift touches both alike; medians of 7.
times <- vapply(seq_len(7L), function(k) {
  t0 <- now(); rt(); t1 <- now(); shell(); t2 <- now()
  c(t1 - t0, t2 - t1)
}, c(0, 0)) / n
mizu_pool_stop(pool)
cat(sprintf("split rt %.9f\nsplit shell %.9f\nsplit outside %.9f\n", median(times[1, ]),
            median(times[2, ]), median(times[1, ] - times[2, ])))
