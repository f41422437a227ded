.exit_hook <- new.env(parent = emptyenv())

.onLoad <- function(libname, pkgname) {
  .Call(wrap__init_native)
  # When R exits: collect garbage (views and handles nobody holds release their shared memory)
  # and unmap the segments kept mapped for reuse, so that nothing of this process's is left in
  # /dev/shm (its lock file goes with the last mapping).
  reg.finalizer(.exit_hook, function(e) {
    gc()
    .Call(wrap__release_mappings)
  }, onexit = TRUE)
}
