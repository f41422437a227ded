test_that("nothing is left in /dev/shm", {
  gc()
  left <- character()
  for (i in 1:100) {
    left <- setdiff(shm_names(), shm_before)
    if (!length(left)) break
    Sys.sleep(0.1)
  }
  expect_identical(left, character())
})
