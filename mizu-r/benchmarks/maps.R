# Compute-bound maps at the machine's limit: how close each map comes to the ideal — the map's
# own sequential time, measured in the same run, divided by the workers — with tasks of 5 us,
# 50 us and 1 ms of computation (`burn`, calibrated at the start: a task takes longer when
# anything else takes its CPU, as real work does), and a skewed map (every hundredth element
# costs 100x). Efficiency is ideal / achieved (100%: the workers never wait and nothing else
# takes their CPUs); each map run is paired with a sequential run just before it (this VM's
# speed drifts), and a row's efficiency is the median over the pairs. A mizu_map row below its
# target — 90% of the ideal (85% for the skewed map) and ahead of both peers — is printed as
# BEHIND TARGET (a report, not a failure).
#
#   Rscript mizu-r/benchmarks/maps.R [--quick] [--workers N]
#
# mizu_map beside parallel's parLapply (PSOCK) and mclapply (fork), each with its default
# chunking; every number is the median of several runs. The first row is a reference for the
# machine: a fork cluster's processes, started beforehand, each running one fixed share of the
# elements and sending back nothing — what this machine and its scheduler give processes that
# only compute, in the same minute. A map can do better (the shares are fixed, and nothing moves
# two of them the kernel put on one CPU), but one far below it loses to its own machinery.

suppressPackageStartupMessages({
  library(mizu)
  library(parallel)
})
args <- commandArgs(trailingOnly = TRUE)
quick <- "--quick" %in% args
workers <- if ("--workers" %in% args) as.integer(args[[which(args == "--workers") + 1L]]) else 2L
# Quick: fewer pairs, the same maps (a map a quarter as long weighs a map's fixed costs four
# times, and three pairs leave a row's median to one unlucky run).
scale <- 1
reps <- if (quick) 5L else 15L

now <- function() unclass(Sys.time())
# A fixed amount of computation: `rounds` rounds of arithmetic.
burn <- function(i, rounds) {
  s <- 0
  for (k in seq_len(rounds)) s <- s + k * 0.5
  i
}
burn_skewed <- function(i, rounds) burn(i, if (i %% 100L == 0L) rounds * 100L else rounds)
rounds_for <- function(us) {
  n <- 200000L
  best <- min(vapply(1:5, function(j) { t0 <- now(); burn(0L, n); now() - t0 }, 0))
  max(1L, as.integer(round(us * 1e-6 / (best / n))))
}

rows <- list(
  list(name = "5 us tasks", f = burn, k = rounds_for(5), n = as.integer(8000 * scale)),
  list(name = "50 us tasks", f = burn, k = rounds_for(50), n = as.integer(800 * scale)),
  list(name = "1 ms tasks", f = burn, k = rounds_for(1000), n = max(4L, as.integer(40 * scale))),
  list(name = "skewed (1% cost 100x)", f = burn_skewed, k = rounds_for(5),
       n = as.integer(4000 * scale))
)
pool <- mizu_pool(workers)
cl <- makePSOCKcluster(workers)
clusterExport(cl, "burn")
# The reference row's processes: forked after `burn` was compiled (`rounds_for` ran it), each
# waits on a fifo for a share — the name of the function, the first and last element, the
# rounds — runs it and answers on another fifo. (Not a socket cluster: R's socket messages can
# wait out TCP's delayed acknowledgement, 40 ms.)
fifos <- tempfile("mizu-shares")
dir.create(fifos)
paths <- lapply(seq_len(workers), function(w) file.path(fifos, paste0(c("go", "done"), w)))
stopifnot(system2("mkfifo", unlist(paths)) == 0)
share_jobs <- lapply(seq_len(workers), function(w) mcparallel({
  go <- fifo(paths[[w]][[1]], "r", blocking = TRUE)
  done <- fifo(paths[[w]][[2]], "w", blocking = TRUE)
  repeat {
    msg <- readLines(go, n = 1L)
    if (!length(msg) || msg == "stop") break
    p <- strsplit(msg, " ", fixed = TRUE)[[1]]
    f <- get(p[[1]], envir = globalenv())
    k <- as.integer(p[[4]])
    for (i in as.integer(p[[2]]):as.integer(p[[3]])) f(i, k)
    writeLines("done", done)
    flush(done)
  }
  NULL
}))
shares <- lapply(paths, function(p) {
  list(go = fifo(p[[1]], "w", blocking = TRUE), done = fifo(p[[2]], "r", blocking = TRUE))
})
machine <- "forked processes, fixed shares"
maps <- list(
  `forked processes, fixed shares` = function(r) {
    fname <- if (identical(r$f, burn)) "burn" else "burn_skewed"
    ends <- lapply(splitIndices(r$n, workers), range)
    for (w in seq_len(workers)) {
      writeLines(sprintf("%s %d %d %d", fname, ends[[w]][[1]], ends[[w]][[2]], r$k), shares[[w]]$go)
      flush(shares[[w]]$go)
    }
    for (w in seq_len(workers)) stopifnot(identical(readLines(shares[[w]]$done, n = 1L), "done"))
  },
  mizu_map = function(r) mizu_map(pool, seq_len(r$n), r$f, rounds = r$k),
  `parLapply (PSOCK)` = function(r) parLapply(cl, seq_len(r$n), r$f, rounds = r$k),
  mclapply = function(r) mclapply(seq_len(r$n), r$f, rounds = r$k, mc.cores = workers)
)
eff <- times <- matrix(NA_real_, length(rows), length(maps), dimnames = list(NULL, names(maps)))
ideals <- vector("list", length(rows))
for (m in names(maps)) {
  for (j in seq_along(rows)) {
    r <- rows[[j]]
    got <- maps[[m]](r)
    stopifnot(m == machine || identical(unlist(got), seq_len(r$n)))
    pairs <- t(vapply(seq_len(reps), function(i) {
      t0 <- now(); lapply(seq_len(r$n), r$f, rounds = r$k); s <- now() - t0
      t0 <- now(); maps[[m]](r); c(s / workers, now() - t0)
    }, c(0, 0)))
    times[j, m] <- median(pairs[, 2])
    eff[j, m] <- median(pairs[, 1] / pairs[, 2])
    ideals[[j]] <- c(ideals[[j]], pairs[, 1])
  }
}
ideal <- vapply(ideals, median, 0)
mizu_pool_stop(pool)
stopCluster(cl)
for (sh in shares) {
  writeLines("stop", sh$go)
  close(sh$go)
  close(sh$done)
}
invisible(mccollect(share_jobs))
unlink(fifos, recursive = TRUE)

cat(sprintf(paste0("\ncompute-bound maps: %d workers, %d CPUs, median of %d runs; ",
                   "efficiency = (sequential time / workers) / time\n"),
            workers, parallel::detectCores(), reps))
names_w <- max(nchar(c(names(maps), "ideal (sequential / workers)")))
cat(sprintf("%-*s", names_w, "map"), sprintf("  %22s", vapply(rows, `[[`, "", "name")), "\n", sep = "")
cat(sprintf("%-*s", names_w, "ideal (sequential / workers)"),
    sprintf("  %19.2f ms", ideal * 1e3), "\n", sep = "")
for (m in names(maps)) {
  cat(sprintf("%-*s", names_w, m), sprintf("  %8.2f ms %8.0f%%", times[, m] * 1e3, 100 * eff[, m]),
      "\n", sep = "")
}
for (j in seq_along(rows)) {
  want <- if (startsWith(rows[[j]]$name, "skewed")) 0.85 else 0.90
  best <- max(eff[j, !names(maps) %in% c("mizu_map", machine)])
  if (eff[j, "mizu_map"] < want || eff[j, "mizu_map"] < best) {
    cat(sprintf("BEHIND TARGET: mizu_map on %s: %.0f%% (target %.0f%%, best peer %.0f%%)\n",
                rows[[j]]$name, 100 * eff[j, "mizu_map"], 100 * want, 100 * best))
  }
}
