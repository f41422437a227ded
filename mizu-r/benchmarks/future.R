# mizu as a `future` backend against future's own multiprocess backends, side by side in one
# run, as ratios: plan(mizu_future) vs plan(multisession) and plan(cluster) (PSOCK).
#
#   Rscript mizu-r/benchmarks/future.R [--quick] [--workers N]
#
# (`cargo xtask bench` and `cargo xtask demo` run it against the installed package.)

suppressPackageStartupMessages({
  library(mizu)
  library(future)
  library(future.apply)
})

args <- commandArgs(trailingOnly = TRUE)
quick <- "--quick" %in% args
workers <- if ("--workers" %in% args) as.integer(args[[which(args == "--workers") + 1L]]) else 2L

now <- function() proc.time()[[3]]
timed <- function(f) { t0 <- now(); f(); now() - t0 }
fmt_time <- function(s) {
  if (s < 1e-3) sprintf("%.1f us", s * 1e6) else if (s < 1) sprintf("%.2f ms", s * 1e3)
  else sprintf("%.2f s", s)
}

cl <- parallel::makePSOCKcluster(workers)
plans <- list(
  mizu = function() plan(mizu_future, workers = workers),
  multisession = function() plan(multisession, workers = workers),
  cluster = function() plan(cluster, workers = cl)
)

n_latency <- if (quick) 50L else 200L
n_each <- if (quick) 200L else 2000L
n_chunked <- 2000L

cat(sprintf("mizu future backend benchmarks: %d workers, R %s, future %s, %d CPUs%s\n",
            workers, getRversion(), packageVersion("future"), parallel::detectCores(),
            if (quick) " (quick)" else ""))

results <- list()
for (name in names(plans)) {
  plans[[name]]()
  invisible(value(future(1)))
  # value(future(1)): one future's whole round trip (creation, globals, launch, collection).
  lat <- timed(function() for (i in seq_len(n_latency)) value(future(1))) / n_latency
  # future_lapply with one future per element, then with default chunking (a future per
  # worker).
  each <- timed(function() future_lapply(seq_len(n_each), function(i) i,
                                         future.chunk.size = 1L)) / n_each
  chunked <- timed(function() future_lapply(seq_len(n_chunked), function(i) i)) / n_chunked
  results[[name]] <- c(latency = lat, each = each, chunked = chunked)
}

# A 1e7-element vector (80 MB) that every one of 8 futures reads: future_lapply over 8
# chunks of its indices, FUN reading the vector as a global.
x <- runif(1e7)
idx <- split(seq_along(x), rep(1:8, each = length(x) / 8))
chunk_sum <- function(ix) sum(x[ix])
big <- list()
for (name in c("mizu", "multisession")) {
  plans[[name]]()
  invisible(value(future(1)))
  before <- .Call(mizu:::wrap__payload_bytes_written)
  secs <- timed(function() {
    s <- future_lapply(idx, chunk_sum, future.chunk.size = 1L)
    stopifnot(isTRUE(all.equal(sum(unlist(s)), sum(x))))
  })
  crossed <- if (name == "mizu") {
    .Call(mizu:::wrap__payload_bytes_written) - before
  } else {
    # What multisession sends: each future's globals, serialized (x with every chunk).
    8 * length(serialize(list(x = x, chunk_sum = chunk_sum), NULL))
  }
  big[[name]] <- c(secs = secs, crossed = crossed)
}
plan(sequential)
parallel::stopCluster(cl)

row <- function(what, key, unit_per) {
  m <- results$mizu[[key]]
  cat(sprintf("%-46s %12s %14s %12s %10.1fx %10.1fx\n", what, fmt_time(m),
              fmt_time(results$multisession[[key]]), fmt_time(results$cluster[[key]]),
              results$multisession[[key]] / m, results$cluster[[key]] / m))
}
cat(sprintf("\n%-46s %12s %14s %12s %11s %11s\n", "", "mizu_future", "multisession",
            "cluster", "vs multis.", "vs cluster"))
row("value(future(1)), per future", "latency")
row(sprintf("future_lapply, a future per element (%d)", n_each), "each")
row(sprintf("future_lapply, default chunking (%d)", n_chunked), "chunked")
cat(sprintf("\nfuture_lapply over 8 chunks reading an 80 MB global vector:\n"))
cat(sprintf("  mizu_future:  %s, %.1f MB crossed (the vector once, shared; the index chunks)\n",
            fmt_time(big$mizu[["secs"]]), big$mizu[["crossed"]] / 1e6))
cat(sprintf("  multisession: %s, %.1f MB crossed (the vector with every future) -> %.1fx\n",
            fmt_time(big$multisession[["secs"]]), big$multisession[["crossed"]] / 1e6,
            big$multisession[["secs"]] / big$mizu[["secs"]]))
