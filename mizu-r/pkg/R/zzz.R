.exit_hook <- new.env(parent = emptyenv())

# The routines every task calls (submit, collect), reached as NativeSymbol objects: plain
# .Call entry points without extendr's per-value bookkeeping (see src/fast.rs).
.native <- new.env(parent = emptyenv())

.onLoad <- function(libname, pkgname) {
  .Call(wrap__init_native)
  list2env(.Call(wrap__native_routines), .native)
  # When R exits: collect garbage (views and handles nobody holds release their shared memory)
  # and unmap the segments kept mapped for reuse, so that nothing of this process's is left in
  # /dev/shm (its lock file goes with the last mapping).
  reg.finalizer(.exit_hook, function(e) {
    gc()
    .Call(wrap__release_mappings)
  }, onexit = TRUE)
}
