# Shared helpers. Every test file stops its pools; teardown checks /dev/shm.

shm_names <- function() .Call(mizu:::wrap__shm_names)
shm_before <- shm_names()

with_pool <- function(n, code, ...) {
  pool <- mizu_pool(n, ...)
  on.exit(mizu_pool_stop(pool))
  code(pool)
}

# Runs R code in a fresh Rscript; returns its output lines.
run_r <- function(code, timeout = 0) {
  f <- tempfile(fileext = ".R")
  writeLines(c(sprintf(".libPaths(c(%s))",
                       paste(encodeString(.libPaths(), quote = '"'), collapse = ", ")),
               code), f)
  on.exit(unlink(f))
  suppressWarnings(system2(file.path(R.home("bin"), "Rscript"), f, stdout = TRUE, stderr = TRUE,
                           timeout = timeout))
}

# A large payload in MB: 100, or a quarter of a small /dev/shm (a container's 64 MiB).
big_mb <- function() {
  out <- suppressWarnings(system2("df", c("-B1", "--output=size", "/dev/shm"), stdout = TRUE))
  total <- suppressWarnings(as.numeric(out[length(out)]))
  if (is.na(total)) 100 else min(100, total / 2^20 / 4)
}

in_ci <- function() nzchar(Sys.getenv("CI"))
