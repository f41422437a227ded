# mizu against the peers R users run today, side by side in one run, as ratios:
# parallel's PSOCK cluster and mcparallel/mclapply (fork), and future's multisession backend.
#
#   Rscript mizu-r/benchmarks/bench.R [--quick] [--workers N]
#
# (`cargo xtask bench` and `cargo xtask demo` run it against the installed package.)

suppressPackageStartupMessages({
  library(mizu)
  library(parallel)
  library(future)
})

args <- commandArgs(trailingOnly = TRUE)
quick <- "--quick" %in% args
workers <- if ("--workers" %in% args) as.integer(args[[which(args == "--workers") + 1L]]) else 2L
scale <- if (quick) 0.25 else 1

now <- function() proc.time()[[3]]
# Median seconds per repetition of `f` (which runs `n` operations): seconds per operation.
per_op <- function(f, n, reps = 3L) {
  f()   # warm up
  median(vapply(seq_len(reps), function(i) { t0 <- now(); f(); now() - t0 }, 0)) / n
}
rows <- list()
report <- function(what, unit, mizu_s, peers) {
  for (peer in names(peers)) {
    rows[[length(rows) + 1L]] <<- data.frame(
      benchmark = what, peer = peer,
      mizu = mizu_s, other = peers[[peer]], unit = unit,
      ratio = peers[[peer]] / mizu_s, stringsAsFactors = FALSE)
  }
}
fmt_time <- function(s) {
  if (s < 1e-3) sprintf("%.1f us", s * 1e6) else if (s < 1) sprintf("%.2f ms", s * 1e3)
  else sprintf("%.2f s", s)
}

cat(sprintf("mizu R benchmarks: %d workers, R %s, %d CPUs%s\n", workers,
            getRversion(), parallel::detectCores(), if (quick) " (quick)" else ""))
# The machine's floor: one cache line's round trip between CPUs 0 and 1 (NA on one CPU).
line_floor <- function() tryCatch(.Call(mizu:::wrap__line_round_trip_ns, 0L, 1L),
                                  error = function(e) NA_real_)
floor_before <- line_floor()
pool <- mizu_pool(workers)
cl <- makePSOCKcluster(workers)
plan(multisession, workers = workers)
invisible(value(future(1)))

# 1. Trivial task round trip: submit one task, wait for its value.
n <- max(200L, as.integer(20000 * scale))
n_psock <- max(100L, as.integer(2000 * scale))
n_slow <- max(20L, as.integer(200 * scale))
rt_mizu <- per_op(function() for (i in seq_len(n)) mizu_collect(mizu_submit(pool, i, i = i)), n)
rt_psock <- per_op(function() for (i in seq_len(n_psock)) clusterCall(cl[1], identity, i), n_psock)
rt_fork <- per_op(function() for (i in seq_len(n_slow)) mccollect(mcparallel(i)), n_slow)
rt_future <- per_op(function() for (i in seq_len(n_slow)) value(future(i)), n_slow)
floor_after <- line_floor()  # (the pool's workers are idle, hence parked, by now)
# R's own part of that round trip (see shell.R).
source(file.path(dirname(sub("^--file=", "", grep("^--file=", commandArgs(FALSE), value = TRUE)[1])), "shell.R"))
rt_shell <- per_op(function() for (i in seq_len(n)) shell_collect(shell_submit(pool, i, i = i)), n)
report("trivial task round trip", "time", rt_mizu,
       list(`PSOCK cluster` = rt_psock, `mcparallel (fork)` = rt_fork,
            `future multisession` = rt_future))

# 1b. The same with a function of the script's: `sq(i)`, whose globals (the function, `i`) are
# found and sent with each task, as a user writes it; PSOCK sends the function with each call.
sq <- function(x) x * x
rt_glob <- per_op(function() for (i in seq_len(n / 4)) mizu_collect(mizu_submit(pool, sq(i))),
                  n / 4)
rt_glob_psock <- per_op(function() for (i in seq_len(n_psock)) clusterCall(cl[1], sq, i), n_psock)
rt_glob_future <- per_op(function() for (i in seq_len(n_slow)) value(future(sq(i))), n_slow)
report("round trip of a script's function, globals found", "time", rt_glob,
       list(`PSOCK cluster` = rt_glob_psock, `future multisession` = rt_glob_future))

# 1c. A longer function of the script's, with loops, that R's JIT compiled in the caller
# (called there first, as a script tries its function before sending it): the function
# travels with each task as its code, and each worker makes and compiles it once.
steps <- function(x) {
  a <- x + 1; b <- a * 2; c <- b - 3; d <- c / 4
  for (j in 1:3) { a <- a + j; b <- b * 1.01 }
  if (a > 10) d <- d + 1 else d <- d - 1
  s <- 0
  for (k in seq_len(5)) s <- s + k * a
  s + d
}
for (i in 1:3) steps(i)
rt_long <- per_op(function() for (i in seq_len(n / 4)) mizu_collect(mizu_submit(pool, steps(i))),
                  n / 4)
rt_long_psock <- per_op(function() for (i in seq_len(n_psock)) clusterCall(cl[1], steps, i),
                        n_psock)
rt_long_future <- per_op(function() for (i in seq_len(n_slow)) value(future(steps(i))), n_slow)
report("round trip of a 10-line script function with loops", "time", rt_long,
       list(`PSOCK cluster` = rt_long_psock, `future multisession` = rt_long_future))

# 1d. Two tasks of ~5 us at once, one per worker, both values taken: a burst smaller than the
# pool, as a caller fanning out a few calls at a time makes it (PSOCK: clusterApply over two).
spin_r <- function(n) { s <- 0; for (k in seq_len(n)) s <- s + k; s }
for (i in 1:3) spin_r(300L)
pair_mizu <- per_op(function() for (i in seq_len(n / 20)) {
  a <- mizu_submit(pool, spin_r(300L))
  b <- mizu_submit(pool, spin_r(300L))
  mizu_collect(a)
  mizu_collect(b)
}, n / 20)
pair_psock <- per_op(function() for (i in seq_len(n_psock / 4)) clusterApply(cl, c(300L, 300L), spin_r),
                     n_psock / 4)
report("two ~5 us tasks at once", "time", pair_mizu, list(`PSOCK cluster` = pair_psock))

# 2. Pipelined throughput: many trivial tasks in flight.
m <- max(1000L, as.integer(20000 * scale))
m_slow <- max(100L, as.integer(1000 * scale))
tp_mizu <- per_op(function() {
  ts <- lapply(seq_len(m), function(i) mizu_submit(pool, i, i = i))
  mizu_collect_all(ts)
}, m)
tp_psock <- per_op(function() clusterApply(cl, seq_len(m_slow), identity), m_slow)
tp_future <- per_op(function() {
  fs <- lapply(seq_len(m_slow / 10), function(i) future(i))
  value(fs)
}, m_slow / 10)
report("pipelined throughput (per task)", "time", tp_mizu,
       list(`PSOCK cluster (clusterApply)` = tp_psock, `future multisession` = tp_future))

# 3. 8 MB double vector there and back.
big <- runif(1e6)
k <- max(5L, as.integer(40 * scale))
v_mizu <- per_op(function() for (i in seq_len(k)) mizu_collect(mizu_submit(pool, x, x = big)), k)
v_psock <- per_op(function() for (i in seq_len(k)) clusterCall(cl[1], identity, big), k)
v_future <- per_op(function() for (i in seq_len(k)) value(future(big, globals = list(big = big))), k)
report("8 MB double vector round trip", "time", v_mizu,
       list(`PSOCK cluster` = v_psock, `future multisession` = v_future))

# 4. Data frame: ~54 000 rows x 10 columns (numeric, integer, factor); add a column, return it.
nr <- 54000L
df <- data.frame(a = runif(nr), b = rnorm(nr), c = seq_len(nr), d = sample(100L, nr, TRUE),
                 e = factor(sample(letters[1:5], nr, TRUE)), f = runif(nr), g = rnorm(nr),
                 h = sample(1000L, nr, TRUE), i = factor(sample(month.name, nr, TRUE)),
                 j = runif(nr))
add_col <- function(d) { d$k <- d$a + d$c; d }
# Measured in the steady state, as the full run's warm-up reaches it: the first few tens of
# frames make the pool's data segments and the first collection paces the rest, whatever `k`.
for (i in seq_len(40L)) mizu_collect(mizu_submit(pool, f(d), f = add_col, d = df))
df_mizu <- per_op(function() for (i in seq_len(k)) mizu_collect(mizu_submit(pool, f(d), f = add_col, d = df)), k)
df_psock <- per_op(function() for (i in seq_len(k)) clusterCall(cl[1], add_col, df), k)
df_future <- per_op(function() for (i in seq_len(k)) value(future(add_col(df), globals = list(add_col = add_col, df = df))), k)
stopifnot(identical(mizu_collect(mizu_submit(pool, f(d), f = add_col, d = df)), add_col(df)))
report("data frame round trip (54k x 10, add a column)", "time", df_mizu,
       list(`PSOCK cluster` = df_psock, `future multisession` = df_future))

# 5. A map of 2 000 tasks of ~10 us each.
work <- function(i) sum(sqrt(seq_len(1500L) + i))
nm <- 2000L
# Median of 9: a map of tens of milliseconds moves by a worker's garbage collection.
seq_s <- per_op(function() lapply(seq_len(nm), work), 1, reps = 9L)
map_mizu <- per_op(function() mizu_map(pool, seq_len(nm), work), 1, reps = 9L)
map_psock <- per_op(function() parLapply(cl, seq_len(nm), work), 1, reps = 9L)
map_fork <- per_op(function() mclapply(seq_len(nm), work, mc.cores = workers), 1, reps = 9L)
stopifnot(identical(mizu_map(pool, seq_len(nm), work), lapply(seq_len(nm), work)))
report(sprintf("map of %d tasks (%.1f us each)", nm, seq_s / nm * 1e6), "time", map_mizu,
       list(`PSOCK cluster (parLapply)` = map_psock, mclapply = map_fork,
            `sequential lapply` = seq_s))

# 6. One 80 MB vector read by 100 tasks: shared once (mizu_share) against passed each time,
# and against a PSOCK cluster given it once (clusterExport) and then sent tasks (parLapply).
x80 <- runif(1e7)
nt <- 100L
first <- function(i, v) v[[1L]]
t0 <- now(); x80s <- mizu_share(x80); share_s <- now() - t0
# (R's timer counts milliseconds: the 100 reads run 20 times over for a finer measure.)
sh_mizu <- per_op(function() for (r in 1:20) for (i in seq_len(nt))
  mizu_collect(mizu_submit(pool, v[[1L]], v = x80s)), 20 * nt)
kk <- max(3L, as.integer(10 * scale))
copy_mizu <- per_op(function() for (i in seq_len(kk)) mizu_collect(mizu_submit(pool, v[[1L]], v = x80)), kk)
t0 <- now(); clusterExport(cl, "x80", envir = environment()); export_s <- now() - t0
sh_psock <- per_op(function() for (i in seq_len(nt)) clusterCall(cl[1], function() x80[[1L]]), nt)
report("80 MB vector read by 100 tasks, one by one (shared once)", "time", sh_mizu,
       list(`mizu, passed each time` = copy_mizu,
            `PSOCK: clusterExport once, then clusterCall` = sh_psock))
shm_map <- per_op(function() for (r in 1:10) mizu_map(pool, seq_len(nt), first, v = x80s), 10 * nt)
shm_psock <- per_op(function() parLapply(cl, seq_len(nt), function(i) x80[[1L]]), nt)
report("80 MB vector read by a map of 100 (shared once, per element)", "time", shm_map,
       list(`PSOCK: clusterExport once, then parLapply` = shm_psock))
# A map of 200 with the 80 MB vector as an extra argument (mizu shares it once per map).
map_x <- per_op(function() mizu_map(pool, seq_len(200L), first, v = x80), 200L, reps = 3L)
map_x_psock <- per_op(function() parLapply(cl, seq_len(200L), first, v = x80), 200L, reps = 3L)
report("map of 200 with an 80 MB extra argument (per element)", "time", map_x,
       list(`PSOCK cluster (parLapply)` = map_x_psock))
cat(sprintf(paste0("sharing: mizu_share took %s once, clusterExport %s; shared per task is %.1fx ",
                   "a trivial round trip\n"), fmt_time(share_s), fmt_time(export_s), sh_mizu / rt_mizu))

mizu_pool_stop(pool)
stopCluster(cl)
plan(sequential)

out <- do.call(rbind, rows)
cat("\n")
w <- max(nchar(out$benchmark))
cat(sprintf("%-*s  %-30s %12s %12s %9s\n", w, "benchmark", "peer", "mizu", "peer", "mizu is"))
for (r in seq_len(nrow(out))) {
  x <- out[r, ]
  cat(sprintf("%-*s  %-30s %12s %12s %8.1fx\n", w, x$benchmark, x$peer, fmt_time(x$mizu),
              fmt_time(x$other), x$ratio))
}
cat("\n(mizu is: how many times less time mizu takes than the peer, same run, same machine)\n")
# Rows with a stated target of their own (a report, not a failure).
if (df_mizu > 1.5e-3) {
  cat(sprintf("BEHIND TARGET: data frame round trip %s (target 1.50 ms)\n", fmt_time(df_mizu)))
}
cat(sprintf(paste0(
  "R's own part of the round trip: the two closures calling a native routine that does ",
  "nothing took %.2f us of the %.2f us\n"), rt_shell * 1e6, rt_mizu * 1e6))
if (!is.na(floor_before) && !is.na(floor_after)) {
  cat(sprintf(paste0(
    "machine floor: one cache line's round trip between cpu0 and cpu1 took %.0f ns before the ",
    "pool started and %.0f ns after the round-trip row (no shared-memory round trip can be ",
    "faster; on this VM it moves between ~100 and ~400 ns with the host's placement); the ",
    "trivial round trip is %.0f of them\n"),
    floor_before, floor_after, rt_mizu * 1e9 / ((floor_before + floor_after) / 2)))
}

# The run's results as JSON when MIZU_BENCH_JSON names a file (`cargo xtask bench` sets it;
# mizu-py/benchmarks/charts.py draws them): per benchmark, seconds for mizu and each peer.
results <- Sys.getenv("MIZU_BENCH_JSON")
if (nzchar(results)) {
  q <- function(s) encodeString(s, quote = '"')
  num <- function(x) if (is.na(x)) "null" else format(x, digits = 6, scientific = TRUE)
  benches <- unique(out$benchmark)
  row_json <- vapply(benches, function(b) {
    x <- out[out$benchmark == b, ]
    vals <- c(sprintf("%s: %s", q("mizu"), num(x$mizu[[1L]])),
              sprintf("%s: %s", vapply(x$peer, q, ""), vapply(x$other, num, "")))
    sprintf('  {"measure": %s, "unit": "s", "higher_is_better": false, "values": {%s}}',
            q(b), paste(vals, collapse = ", "))
  }, "")
  floors <- c(floor_before, floor_after)
  writeLines(c(
    "{",
    ' "language": "r",',
    ' "title": "mizu vs R peers",',
    sprintf(' "date": %s,', q(format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"))),
    sprintf(' "machine": %s,', q(sprintf("%s, %d CPUs, R %s", R.version$arch,
                                         parallel::detectCores(), getRversion()))),
    sprintf(' "workers": %d,', workers),
    sprintf(' "quick": %s,', if (quick) "true" else "false"),
    sprintf(' "floor_ns": [%s],', paste(vapply(floors[!is.na(floors)], num, ""), collapse = ", ")),
    ' "round_trip": "trivial task round trip",',
    ' "throughput": "pipelined throughput (per task)",',
    ' "rows": [',
    paste(row_json, collapse = ",\n"),
    " ]",
    "}"), results)
}
