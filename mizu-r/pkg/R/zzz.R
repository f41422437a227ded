.exit_hook <- new.env(parent = emptyenv())

# The routines every task calls (submit, collect), reached as NativeSymbol objects: plain
# .Call entry points without extendr's per-value bookkeeping (see src/fast.rs). Each is also a
# namespace binding of its own, set when the package loads: `.native$collect` costs ~0.3 us
# per call (`$` dispatch), a binding ~0.03 us.
.native <- new.env(parent = emptyenv())
.native_submit <- NULL
.native_submit_expr <- NULL
.native_submit_frame <- NULL
.native_collect <- NULL
.native_collect_value <- NULL
.native_collect_values <- NULL
.native_submit_exprs <- NULL
.native_submit_msgs <- NULL
.native_tasks_ok <- NULL
.native_task_done <- NULL
.native_nop <- NULL
.native_each <- NULL
.native_chunk_msgs <- NULL
.native_fill_hole <- NULL
.native_bind_globals <- NULL
.native_unbind_globals <- NULL
.native_expr_message <- NULL
.native_function_globals <- NULL
.native_find_identical <- NULL
.native_attach_packages <- NULL

.onLoad <- function(libname, pkgname) {
  .Call(wrap__init_native)
  routines <- .Call(wrap__native_routines)
  list2env(routines, .native)
  ns <- topenv()
  for (n in names(routines)) {
    # The class R gives its own native symbols: `.Call` reads only the pointer's tag, and
    # R CMD check knows the binding for a native routine.
    class(routines[[n]]) <- "NativeSymbol"
    assign(paste0(".native_", n), routines[[n]], envir = ns)
  }
  # When R exits: collect garbage (views and handles nobody holds release their shared memory),
  # remove the names of the segments holding mizu_share() values, and unmap the segments kept
  # mapped for reuse, so that nothing of this process's is left in /dev/shm (its lock file
  # goes with the last mapping).
  reg.finalizer(.exit_hook, function(e) {
    gc()
    .Call(wrap__release_shared)
    .Call(wrap__release_mappings)
  }, onexit = TRUE)
}
