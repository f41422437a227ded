.onLoad <- function(libname, pkgname) {
  .Call(wrap__init_native)
}
