# What a container's 64 MiB /dev/shm must carry for R, run by `cargo xtask test` inside a
# private mount namespace with a 64 MiB tmpfs over /dev/shm (outside one it refuses to run):
# a 200 MB vector spills to files in the system's temporary directory, there and back and
# shared, said once; nothing is left behind.
library(mizu)
size <- as.numeric(system2("df", c("-B1", "--output=size", "/dev/shm"), stdout = TRUE)[2])
if (size > 64 * 2^20) stop("small_shm/check.R runs in a namespace with a 64 MiB /dev/shm")
check <- function(what, ok) {
  cat(if (isTRUE(ok)) "ok  " else "FAIL", what, "\n")
  if (!isTRUE(ok)) quit(status = 1)
}
spilled <- function() grep("^mizu_.*s$", list.files(Sys.getenv("TMPDIR", "/tmp")), value = TRUE)
pool <- mizu_pool(1)
x <- runif(2.5e7)                                   # 200 MB
check("a 200 MB vector there and back", identical(mizu_collect(mizu_submit(pool, v, v = x)), x))
check("its sum in the worker", identical(mizu_collect(mizu_submit(pool, sum(v), v = x * 2)), sum(x * 2)))
s <- mizu_share(x)
check("a shared 200 MB vector read by 100 tasks",
      identical(unlist(mizu_collect_all(lapply(1:100, function(i) mizu_submit(pool, v[i], v = s, i = i)))), x[1:100]))
check("values spilled", length(spilled()) > 0)
rm(s)
mizu_pool_stop(pool)
invisible(gc())
# Memory nothing holds goes back within a few seconds (idle segments are kept ~2 s for reuse).
deadline <- Sys.time() + 30                         # a hang guard, not a bound
while (length(spilled()) > 0 && Sys.time() < deadline) Sys.sleep(0.1)
check("nothing left spilled after the pool stopped and the values went", length(spilled()) == 0)
