library(testthat)
library(mizu)

test_check("mizu")
