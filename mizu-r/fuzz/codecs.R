# Structure-aware fuzzing of the mizu R package's native decoder: R serializations (checked
# before R reads them), the compact encoding of small values and the out-of-band payload (a
# serialization and its vectors, data frames and Arrow values, inline or by reference). It
# starts from payloads the encoder wrote and mutates them (byte flips, truncation, insertions,
# length words set near a boundary, splices of another seed); every input must decode or fail
# with mizu's error saying the payload is malformed or cannot be read — anything else (another
# error, R printing an error of its own, a crash of R) fails.
#
#   Rscript mizu-r/fuzz/codecs.R CASES   (run by `cargo xtask fuzz`, with the package installed)

suppressPackageStartupMessages(library(mizu))
args <- commandArgs(trailingOnly = TRUE)
cases <- if (length(args) >= 1) as.integer(args[[1]]) else 10000L
set.seed(if (length(args) >= 2) as.integer(args[[2]]) else 1L)

encode <- function(x) .Call(mizu:::wrap__codec_encode, x)
decode <- function(b) .Call(mizu:::wrap__codec_decode, b)

shared <- mizu_share(runif(5000))
values <- list(
  NULL, 1L, c(a = 1.5, b = NA), "x", c(TRUE, NA), list(1, "a", list(NULL)),
  factor(c("u", "v", "u")), as.Date("2024-01-02"), quote(f(x, y = 2)), function(x) x + 1,
  runif(2000), matrix(1:4000, 2), rep(c("x", NA, "\u00e9"), 300),
  data.frame(a = 1:2000, b = rep(c("p", "q"), 1000), f = factor(rep(c("u", "v"), 1000))),
  list(a = runif(2000), m = matrix(1:4000, 2)), list(shared = shared, n = 1)
)
seeds <- lapply(values, encode)
tags <- vapply(seeds, function(s) rawToChar(s[1]), "")
stopifnot(all(c("R", "K", "r") %in% tags))
for (s in seeds) invisible(decode(s))

word <- function(v) {
  x <- as.numeric(v)
  as.raw(vapply(0:7, function(k) (x %/% 256^k) %% 256, 0))
}
boundaries <- list(word(0), word(1), word(2^31), as.raw(rep(0xff, 8)), as.raw(c(rep(0, 7), 0x80)))

mutate <- function(b) {
  for (k in seq_len(sample(4, 1))) {
    n <- length(b)
    op <- sample(5, 1)
    if (op == 1 && n > 0) {
      i <- sample(n, 1)
      b[i] <- as.raw(bitwXor(as.integer(b[i]), sample(255, 1)))
    } else if (op == 2 && n > 0) {
      b <- b[seq_len(sample(n, 1) - 1)]
    } else if (op == 3) {
      i <- sample(n + 1, 1) - 1
      b <- c(b[seq_len(i)], as.raw(sample(0:255, 1)), b[seq_len(n - i) + i])
    } else if (op == 4 && n >= 8) {
      i <- sample(n - 7, 1)
      b[i:(i + 7)] <- boundaries[[sample(length(boundaries), 1)]]
    } else {
      o <- seeds[[sample(length(seeds), 1)]]
      b <- c(b[seq_len(sample(n + 1, 1) - 1)], o[seq_len(length(o) - sample(length(o) + 1, 1) + 1) +
        (sample(length(o) + 1, 1) - 1) * 0])
    }
  }
  b
}

decoded <- refused <- 0L
for (i in seq_len(cases)) {
  b <- mutate(seeds[[(i - 1L) %% length(seeds) + 1L]])
  r <- tryCatch({
    if (Sys.getenv("MIZU_FUZZ_TRACE") != "") cat("case", i, "\n")
    decode(b)
    TRUE
  }, error = function(e) {
    if (!grepl("malformed|cannot read", conditionMessage(e))) {
      stop("case ", i, ": an error that does not say the payload is malformed: ",
           conditionMessage(e), call. = FALSE)
    }
    FALSE
  })
  if (r) decoded <- decoded + 1L else refused <- refused + 1L
}
cat(sprintf("fuzz R payloads: %d cases, %d decoded, %d refused as malformed\n",
            cases, decoded, refused))
stopifnot(refused > 0L)
