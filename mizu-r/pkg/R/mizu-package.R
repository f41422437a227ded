#' mizu: zero-copy parallel tasks over shared memory
#'
#' A pool of R worker processes ([mizu_pool()]) runs tasks ([mizu_submit()], [mizu_map()])
#' that travel through shared memory: no sockets, no pipes, no dispatcher process. Large
#' vectors and data frames cross as read-only ALTREP views of shared pages, copied only when
#' modified. Seeded maps draw random numbers from per-element Philox streams, so results do
#' not depend on the number of workers or on chunking. [mizu_channel()] connects this
#' process with one peer process.
#'
#' @keywords internal
#' @useDynLib mizu, .registration = TRUE
"_PACKAGE"
