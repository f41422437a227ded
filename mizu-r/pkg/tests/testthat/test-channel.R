echo_peer <- quote(repeat {
  x <- mizu_recv(channel)
  if (mizu_is_sentinel(x)) break
  mizu_send(channel, x)
})

test_that("a channel carries values both ways and closes cleanly", {
  ch <- mizu_channel(eval(echo_peer), echo_peer = echo_peer)
  expect_true(mizu_send(ch, list(a = 1, b = "two")))
  expect_identical(mizu_recv(ch, timeout = 60), list(a = 1, b = "two"))
  big <- runif(1e5)
  mizu_send(ch, big)
  got <- mizu_recv(ch, timeout = 60)
  expect_identical(got, big)
  expect_true(mizu_is_view(got))
  n <- mizu_send_batch(ch, as.list(1:10))
  expect_equal(as.integer(n), 10L)
  got <- list()
  while (length(got) < 10) got <- c(got, mizu_recv_batch(ch, max = 10, timeout = 60))
  expect_identical(got, as.list(1:10))
  expect_identical(mizu_recv(ch, timeout = 0.05), mizu_timeout)
  expect_equal(mizu_close(ch), 0L)
})

test_that("a channel's capacity is rounded up, and values of every size cross", {
  ch <- mizu_channel(eval(echo_peer), echo_peer = echo_peer, .capacity = 3)
  for (n in c(1, 900, 1020, 1030, 5000, 100000)) {
    s <- strrep("x", n)
    expect_true(mizu_send(ch, s))
    expect_identical(mizu_recv(ch, timeout = 60), s)
  }
  mizu_close(ch, wait = 30)
  # A peer that does not read yet: an empty ring of 3 rounded up takes 4, no more.
  gate <- tempfile()
  ch <- mizu_channel({
    while (!file.exists(gate)) Sys.sleep(0.001)
    eval(echo_peer)
  }, gate = gate, echo_peer = echo_peer, .capacity = 3)
  expect_equal(as.integer(mizu_send_batch(ch, as.list(letters[1:6]))), 4L)
  expect_identical(mizu_send(ch, "z"), mizu_full)
  file.create(gate)
  expect_identical(unlist(lapply(1:4, function(i) mizu_recv(ch, timeout = 60))), letters[1:4])
  mizu_close(ch, wait = 30)
  unlink(gate)
})

test_that("the peer's close arrives as mizu_closed after its messages", {
  ch <- mizu_channel({
    for (i in 1:3) mizu_send(channel, i * k)
  }, k = 10)
  got <- list()
  repeat {
    x <- mizu_recv(ch, timeout = 60)
    if (mizu_is_sentinel(x)) break
    got[[length(got) + 1]] <- x
  }
  expect_identical(x, mizu_closed)
  expect_identical(got, list(10, 20, 30))
  mizu_close(ch)
})

test_that("a killed peer is reported as mizu_peer_gone; a full ring as mizu_full", {
  ch <- mizu_channel({
    mizu_send(channel, Sys.getpid())
    Sys.sleep(120)
  }, .capacity = 4)
  pid <- mizu_recv(ch, timeout = 60)
  sent <- 0
  repeat {
    r <- mizu_send(ch, sent)
    if (!isTRUE(r)) break
    sent <- sent + 1
  }
  expect_identical(r, mizu_full)
  expect_gte(sent, 4)
  tools::pskill(pid, tools::SIGKILL)
  expect_identical(mizu_recv(ch, timeout = 60), mizu_peer_gone)
  r <- mizu_send(ch, 1)
  expect_true(identical(r, mizu_peer_gone) || identical(r, mizu_full))
  mizu_close(ch, wait = 1)
})

test_that("channel arguments are checked", {
  expect_error(mizu_channel(1, .capacity = "a"), "number of messages")
  expect_error(mizu_channel(1, .capacity = NA), "number of messages")
  expect_error(mizu_channel(1, .capacity = 0), "capacity must be 1..=1073741824")
  expect_error(mizu_channel(1, .capacity = 2^31), "capacity must be 1..=1073741824")
  expect_error(mizu_send("x", 1), "mizu_channel")
  expect_error(mizu_channel(1, 2), "must be named")
  # a forged channel around an external pointer of another kind is refused, not dereferenced
  fake <- structure(list(ptr = mizu:::.native$submit), class = "mizu_channel")
  expect_error(mizu_send(fake, 1), "mizu channel")
  expect_error(mizu_recv(fake, 0), "mizu channel")
})
