"""pymizu.Channel between this process and a spawned peer process."""

import os
import signal
import time

import numpy as np
import pytest

import pymizu

ECHO = """
for msg in channel:
    channel.send(msg)
"""


def test_echo_round_trips_objects_and_arrays():
    with pymizu.Channel.spawn(ECHO) as ch:
        for obj in [1, "two", (3, None), {"k": [1.5]}]:
            assert ch.send(obj) is True
            assert ch.recv(timeout=60) == obj
        a = np.arange(1_000_000, dtype=np.float32).reshape(1000, 1000)
        assert ch.send(a) is True
        b = ch.recv(timeout=60)
        assert np.array_equal(a, b) and not b.flags.writeable


def test_messages_of_every_size_around_a_slot_arrive_whole_and_sizes_are_rounded_up(tmp_path):
    # Shorter than a slot: in the ring; longer: through a region. capacity 1000 -> 1024,
    # slot_size 1000 -> 1024.
    with pymizu.Channel.spawn(ECHO, capacity=1000, slot_size=1000) as ch:
        for n in (0, 900, 1000, 1010, 1023, 1024, 1025, 5000, 100_000):
            msg = bytes(range(256)) * (n // 256) + b"x" * (n % 256)
            assert ch.send(msg) is True
            assert ch.recv(timeout=60) == msg
    # A peer that does not read yet: an empty ring of 1000 rounded up takes 1024, no more.
    gate = os.path.join(str(tmp_path), "gate")
    peer = f"import os, time\nwhile not os.path.exists({gate!r}): time.sleep(0.001)\n" + ECHO
    with pymizu.Channel.spawn(peer, capacity=1000) as ch:
        assert ch.send_batch([b"y"] * 2000) == 1024
        assert ch.send(b"z") is pymizu.FULL
        open(gate, "w").close()
        assert [ch.recv(timeout=60) for _ in range(1024)] == [b"y"] * 1024


def test_bad_channel_sizes_are_clear_errors():
    for kw, what in (
        (dict(capacity=0), "capacity"),
        (dict(capacity=-1), "capacity"),
        (dict(capacity=2.5), "capacity"),
        (dict(slot_size=0), "slot_size"),
        (dict(capacity=2**31), r"capacity must be 1\.\.=1073741824"),
        (dict(slot_size=2**21), r"slot_size must be 16\.\.=1048576"),
    ):
        with pytest.raises((ValueError, pymizu.MizuError), match=what):
            pymizu.Channel.spawn(ECHO, **kw)


def test_sentinels_are_returned_and_falsy():
    for s in (pymizu.FULL, pymizu.TIMEOUT, pymizu.CLOSED, pymizu.PEER_GONE):
        assert not s
    with pymizu.Channel.spawn("import time\ntime.sleep(60)", capacity=4) as ch:
        assert ch.recv(timeout=0.05) is pymizu.TIMEOUT
        sent = [ch.send(i) for i in range(10)]
        assert sent[:4] == [True] * 4 and sent[-1] is pymizu.FULL
        ch.close()
        assert ch.send(1) is pymizu.CLOSED


def test_batches_and_iteration_until_closed():
    producer = "channel.send_batch(range(500))\n"
    with pymizu.Channel.spawn(producer) as ch:
        got = list(ch)
    assert got == list(range(500))
    assert ch.recv(timeout=1) is pymizu.CLOSED


def test_a_killed_peer_is_peer_gone_not_a_hang():
    with pymizu.Channel.spawn("import os\nchannel.send(os.getpid())\nimport time\ntime.sleep(60)") as ch:
        pid = ch.recv(timeout=60)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (m := ch.recv(timeout=0.1)) is pymizu.TIMEOUT:
            assert time.monotonic() < deadline, "hang guard"
        assert m is pymizu.PEER_GONE
        while (s := ch.send(1)) is True:
            assert time.monotonic() < deadline, "hang guard"
        assert s is pymizu.PEER_GONE


def test_attach_by_token_from_a_peer():
    with pymizu.Channel.spawn("channel.send(channel.token)\nchannel.send(channel.recv(timeout=60) * 2)") as ch:
        assert ch.token.startswith("/mizu_")
        assert ch.recv(timeout=60) == ch.token
        ch.send(21)
        assert ch.recv(timeout=60) == 42


def test_a_bad_token_is_a_clear_error():
    with pytest.raises(pymizu.MizuError):
        pymizu.Channel.attach("/mizu_0_nonexistent")


def test_infinite_timeouts_wait_nan_is_refused():
    with pymizu.Channel.spawn(ECHO) as ch:
        assert ch.send(5) is True
        assert ch.recv(timeout=float("inf")) == 5
        assert ch.send(6) is True
        assert ch.recv(timeout=1e300) == 6
        with pytest.raises(ValueError, match="NaN"):
            ch.recv(timeout=float("nan"))


def _mizu_shm():
    return {n for n in os.listdir("/dev/shm") if n.startswith("mizu")}


def test_a_finished_channel_leaves_nothing_in_dev_shm_at_once():
    before = _mizu_shm()
    with pymizu.Channel.spawn(ECHO) as ch:
        ch.send(np.ones(100_000))
        got = ch.recv(timeout=60)
        assert got.sum() == 100_000
        del got
    # The peer exited and nothing is left to read: the channel's segments are gone although
    # `ch` is still referenced.
    assert _mizu_shm() - before == set()
    assert ch.recv(timeout=0) is pymizu.CLOSED
    assert ch.send(1) is pymizu.CLOSED


def test_a_writable_shared_array_crosses_a_channel_by_reference():
    out = pymizu.zeros(8)
    peer = "a = channel.recv(timeout=60)\na[:] = 5.0\nchannel.send(bool(a.flags.writeable))"
    with pymizu.Channel.spawn(peer) as ch:
        assert ch.send(out) is True
        assert ch.recv(timeout=60) is True
    assert out.tolist() == [5.0] * 8
