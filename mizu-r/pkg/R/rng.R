# Per-element random streams through R's user-supplied RNG hook (see src/rng.rs in mizu-r).

.check_seed <- function(seed) {
  if (is.null(seed)) return(NULL)
  if (!is.numeric(seed) || length(seed) != 1L || is.na(seed) || seed < 0 ||
      seed >= 2^53 || seed != round(seed)) {
    stop("`.seed` must be a whole number in [0, 2^53) (or NULL)", call. = FALSE)
  }
  as.numeric(seed)
}

# Switches R's RNG to the user-supplied hook (mizu's streams; each element then selects its
# stream with rng_enter); returns what .rng_restore needs to put the caller's RNG back.
.rng_switch <- function() {
  genv <- globalenv()
  had <- exists(".Random.seed", envir = genv, inherits = FALSE)
  saved <- list(had, if (had) get(".Random.seed", envir = genv, inherits = FALSE), RNGkind())
  suppressWarnings(RNGkind("user-supplied"))
  saved
}

.rng_restore <- function(saved) {
  genv <- globalenv()
  kind <- saved[[3]]
  RNGkind(kind[[1]], kind[[2]], kind[[3]])
  if (saved[[1]]) {
    assign(".Random.seed", saved[[2]], envir = genv)
  } else if (exists(".Random.seed", envir = genv, inherits = FALSE)) {
    rm(".Random.seed", envir = genv)
  }
  .Call(wrap__rng_exit)
}

#' The random stream of a map element
#'
#' Inside element `i` of `mizu_map(..., .seed = seed)`, R's random number generator draws
#' from the Philox4x64-10 stream of `(seed, i - 1)`: `runif(k)` there equals
#' `mizu_stream(seed, i, k)`, and numpy's
#' `Generator(Philox(key = seed, counter = (i - 1) << 128)).random(k)` in Python.
#'
#' @param seed The map's seed.
#' @param element The element's position (1-based).
#' @param n How many numbers.
#' @return `n` doubles in \[0, 1).
#' @examples
#' mizu_stream(42, 1, 3)
#' @export
mizu_stream <- function(seed, element, n) {
  seed <- .check_seed(seed)
  if (is.null(seed)) stop("`seed` must be a whole number", call. = FALSE)
  if (!is.numeric(element) || length(element) != 1L || is.na(element) || element < 1 ||
      element != round(element)) {
    stop("`element` must be one positive whole number", call. = FALSE)
  }
  if (!is.numeric(n) || length(n) != 1L || is.na(n) || n < 0 || n > .Machine$integer.max) {
    stop("`n` must be a non-negative whole number", call. = FALSE)
  }
  .Call(wrap__rng_stream, seed, as.numeric(element) - 1, as.integer(n))
}
