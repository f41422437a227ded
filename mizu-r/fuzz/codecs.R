# Structure-aware fuzzing of the mizu R package's native decoders: R serializations (checked
# before R reads them), the compact encoding of small values, the out-of-band payload (a
# serialization and its vectors, data frames and Arrow values, inline or by reference), and
# what an R pool or worker reads of another language's payloads (results and errors as Python
# sends them — the cross-language golden corpus — and tasks and map chunks). It starts from
# payloads the encoders wrote and mutates them (byte flips, truncation, insertions, length
# words set near a boundary, splices of another seed); every input must decode or fail with
# mizu's error saying the payload is malformed or cannot be read — anything else (another
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

mutate <- function(b, seeds) {
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

fuzz <- function(name, decode, seeds) {
  decoded <- refused <- 0L
  for (i in seq_len(cases)) {
    b <- mutate(seeds[[(i - 1L) %% length(seeds) + 1L]], seeds)
    r <- tryCatch({
      if (Sys.getenv("MIZU_FUZZ_TRACE") != "") cat(name, "case", i, "\n")
      decode(b)
      TRUE
    }, error = function(e) {
      if (!grepl("malformed|cannot read", conditionMessage(e))) {
        stop(name, " case ", i, ": an error that does not say the payload is malformed: ",
             conditionMessage(e), call. = FALSE)
      }
      FALSE
    })
    if (r) decoded <- decoded + 1L else refused <- refused + 1L
  }
  cat(sprintf("fuzz %s: %d cases, %d decoded, %d refused as malformed\n",
              name, cases, decoded, refused))
  stopifnot(refused > 0L)
}

fuzz("R payloads", decode, seeds)

# Results and errors as Python (or R) sends them to an R pool.
corpus <- file.path("mizu-wire", "tests", "corpus", "xlang")
read_bytes <- function(p) readBin(p, "raw", file.size(p))
xvalues <- lapply(sort(list.files(corpus, pattern = "[.]bin$", full.names = TRUE)), read_bytes)
stopifnot(length(xvalues) > 10L)
xloads <- function(b) .Call(mizu:::wrap__xlang_loads, b)
for (s in xvalues) invisible(xloads(s))
fuzz("cross-language results", xloads, xvalues)

# Tasks and map chunks as a pool of another language sends them to an R worker.
xtask <- function(call, elements = NULL) .Call(mizu:::wrap__xlang_task_dumps, call, elements)
call <- mizu_call("math:fsum", runif(5), "\u6c34", list(1L, NULL), flag = TRUE)
xtasks <- list(
  xtask(call),
  xtask(mizu_call(source = "lambda x: x + 1")),
  xtask(call, list(1.5, "a", 1:4))
)
xtask_loads <- function(b) .Call(mizu:::wrap__xlang_task_loads, b)
for (s in xtasks) invisible(xtask_loads(s))
fuzz("cross-language tasks", xtask_loads, xtasks)
