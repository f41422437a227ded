# The cross-language golden corpus (mizu-wire/tests/corpus/xlang): every row of the value
# mapping, as the bytes one language sends and the value the other must read from them.
# rows.tsv names each row, the language that writes it, the Python value and the R value.
# Rows Python writes: R must read exactly the R value from the stored bytes (bits of doubles
# included). Rows R writes: encoding the R value must give exactly the stored bytes (the Python
# suite checks the value Python reads). MIZU_BLESS=1 rewrites R's files instead of comparing.

corpus_dir <- function() {
  ws <- Sys.getenv("MIZU_WORKSPACE", normalizePath(file.path("..", "..", "..", ".."), mustWork = FALSE))
  file.path(ws, "mizu-wire", "tests", "corpus", "xlang")
}

corpus_rows <- function() {
  lines <- readLines(file.path(corpus_dir(), "rows.tsv"), encoding = "UTF-8")
  lines <- lines[nzchar(lines) & !startsWith(lines, "#")]
  parts <- strsplit(lines, "\t", fixed = TRUE)
  data.frame(
    name = vapply(parts, `[[`, "", 1),
    by = vapply(parts, `[[`, "", 2),
    r = vapply(parts, `[[`, "", 4)
  )
}

corpus_file <- function(by, name) file.path(corpus_dir(), sprintf("%s-%s.bin", by, name))
read_bytes <- function(f) readBin(f, "raw", file.info(f)$size)
r_value <- function(expr) eval(parse(text = expr, keep.source = FALSE), envir = baseenv())

test_that("the corpus is there, every row with its file", {
  expect_true(dir.exists(corpus_dir()))
  rows <- corpus_rows()
  expect_gt(nrow(rows), 60)
  files <- sort(list.files(corpus_dir(), pattern = "[.]bin$"))
  expect_identical(files, sort(sprintf("%s-%s.bin", rows$by, rows$name)))
})

test_that("R reads the R value from every row Python wrote", {
  rows <- corpus_rows()
  rows <- rows[rows$by == "py", ]
  for (i in seq_len(nrow(rows))) {
    got <- .Call(mizu:::wrap__xlang_loads, read_bytes(corpus_file("py", rows$name[i])))
    want <- r_value(rows$r[i])
    # Views compare by their elements; doubles bit for bit.
    expect_true(identical(got, want, num.eq = FALSE), label = rows$name[i],
                info = paste(deparse(got), collapse = " "))
  }
})

test_that("R writes the stored bytes for every row it writes", {
  rows <- corpus_rows()
  rows <- rows[rows$by == "r", ]
  for (i in seq_len(nrow(rows))) {
    got <- .Call(mizu:::wrap__xlang_dumps, r_value(rows$r[i]))
    f <- corpus_file("r", rows$name[i])
    if (identical(Sys.getenv("MIZU_BLESS"), "1")) writeBin(got, f)
    expect_identical(got, read_bytes(f), label = rows$name[i])
  }
})

test_that("malformed bytes are an error, never a crash", {
  good <- read_bytes(corpus_file("py", "arrow-table"))
  for (bad in list(raw(0), good[1:40], good[seq_len(length(good) - 8)], c(as.raw(c(0x58, 0x58)), good[-(1:2)]))) {
    expect_error(.Call(mizu:::wrap__xlang_loads, bad))
  }
})
