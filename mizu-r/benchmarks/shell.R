# R's own part of an R caller's round trip, for bench.R and split.R (sourced by both, so that
# they measure the same thing): closures of the same shape as mizu_submit and mizu_collect
# (argument matching, promises, `.External2` handing over the frame) calling a native routine
# that does nothing.
nop <- mizu:::.native_nop
shell_submit <- function(pool, expr, ...) .External2(nop)
shell_collect <- function(task, timeout = Inf) .Call(nop, task, timeout, NULL, NULL)
