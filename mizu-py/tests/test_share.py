"""Shared objects are copied into shared memory once and sent by reference from then on: the
workers see the same memory (checked by where it lives, not by timings)."""

import functools
import gc
import itertools
import os
import signal
import time

import numpy as np
import pandas as pd
import pytest

import pymizu
import tasks
from pymizu import _native

BIG = 1 << 20  # elements: 8 MB of float64


@pytest.fixture(scope="module")
def pool():
    with pymizu.Pool(2) as p:
        yield p


def region(a):
    """(segment, region offset): which shared region holds `a` (the offset inside may vary)."""
    r = _native.shared_region(a)
    return None if r is None else r[:2]


def test_share_makes_a_read_only_copy_in_shared_memory():
    a = np.arange(BIG, dtype=np.float64)
    s = pymizu.share(a)
    assert pymizu.is_shared(s) and not pymizu.is_shared(a)
    assert np.array_equal(s, a) and s.dtype == a.dtype and s.shape == a.shape
    with pytest.raises(ValueError, match="read-only"):
        s[0] = 1.0
    c = s.copy()  # a private, writable copy; the shared one is unchanged
    c[0] = 42.0
    assert s[0] == 0.0 and not pymizu.is_shared(c)


def test_shapes_orders_and_dtypes_survive_sharing():
    for a in (
        np.arange(600_000, dtype=np.int32).reshape(600, 1000),
        np.asfortranarray(np.arange(600_000, dtype=np.float32).reshape(1000, 600)),
        np.arange(1_000_000, dtype=np.int64)[::2],  # strided: shared as a contiguous copy
        np.array(["2020-01-01"] * 100_000, dtype="datetime64[ns]"),
    ):
        s = pymizu.share(a)
        assert np.array_equal(s, a) and s.dtype == a.dtype and pymizu.is_shared(s)


def test_a_shared_array_sent_to_many_tasks_is_never_copied_again(pool):
    s = pymizu.share(np.arange(BIG, dtype=np.float64))
    mine = region(s)
    seen = {region_and_sum for region_and_sum in (pool.submit(tasks.where, s).result(timeout=60) for _ in range(20))}
    assert {r[:2] for r, _ in seen} == {mine}, "every task viewed the caller's shared copy"
    assert {x for _, x in seen} == {float(s.sum())}
    # Inside a pickled call too (a keyword argument, a container), and back.
    assert pool.submit(tasks.where_indexed, 0, a=s).result(timeout=60)[1][:2] == mine
    r = pool.submit(tasks.hold_and_echo, {"x": s}).result(timeout=60)
    assert region(r["x"]) == mine, "sent back by reference too"


def test_an_array_sent_again_unchanged_is_not_copied_again_and_a_changed_one_is(pool):
    # The workers keep what they receive, so a copy's memory cannot be reused by the next.
    a = np.arange(BIG, dtype=np.float64)
    first = {pool.submit(tasks.keep_where, i, a).result(timeout=60)[:2] for i in range(6)}
    assert len(first) == 1, "one copy serves every send of the unchanged array"
    # Modified in place: the next send copies it anew, and the workers see the new bytes.
    a[123] = -1.0
    changed = pool.submit(tasks.where, a).result(timeout=60)
    assert changed[0][:2] not in first and changed[1] == float(a.sum())
    again = {pool.submit(tasks.keep_where, 10 + i, a).result(timeout=60)[:2] for i in range(3)}
    assert again == {changed[0][:2]}
    # Another array with the same bytes is its own copy; a shared one is never copied.
    b = a.copy()
    assert pool.submit(tasks.where, b).result(timeout=60)[0][:2] not in again
    s = pymizu.share(a)
    views = {pool.submit(tasks.keep_where, 20 + i, s).result(timeout=60)[:2] for i in range(6)}
    for _ in range(4):
        pool.submit(tasks.forget_all).result(timeout=60)
    assert views == {region(s)}
    # The copy goes with its array (one larger than a store segment has a segment of its own,
    # whose name goes with it).
    big = np.ones(3 << 20)
    name = pool.submit(tasks.where, big).result(timeout=60)[0][0]
    assert _segment_exists(name)
    del big
    gc.collect()
    deadline = time.monotonic() + 30
    while _segment_exists(name):
        assert time.monotonic() < deadline, "the copy outlived its array"
        time.sleep(0.02)


def test_the_executor_sends_shared_arrays_by_reference_too():
    s = pymizu.share(np.arange(BIG, dtype=np.float64))
    with pymizu.PoolExecutor(2) as ex:
        got = {ex.submit(tasks.where, s).result(timeout=60)[0][:2] for _ in range(10)}
    assert got == {region(s)}


def test_a_shared_frame_reaches_workers_as_views_of_the_same_memory(pool):
    df = pd.DataFrame({"a": np.arange(BIG, dtype=np.float64), "b": np.arange(BIG, dtype=np.int64)})
    s = pymizu.share(df)
    assert isinstance(s, pd.DataFrame) and s.equals(df)
    mine = [region(s[c].to_numpy()) for c in s.columns]
    assert all(m is not None for m in mine)
    for _ in range(5):
        theirs, total = pool.submit(tasks.frame_where, s).result(timeout=60)
        assert [t[:2] for t in theirs] == mine
        assert total == float(df.to_numpy().sum())


def test_pyarrow_and_polars_objects_can_be_shared(pool):
    pa = pytest.importorskip("pyarrow")
    pl = pytest.importorskip("polars")
    t = pa.table({"x": np.arange(BIG, dtype=np.float64)})
    st = pymizu.share(t)
    assert st.equals(t)
    assert region(np.asarray(st.column("x").chunk(0))) is not None
    f = pl.DataFrame({"x": np.arange(BIG, dtype=np.float64)})
    sf = pymizu.share(f)
    assert sf.equals(f)
    assert region(sf["x"].to_numpy()) is not None


def test_a_map_sends_a_repeated_big_argument_once(pool):
    big = np.arange(BIG, dtype=np.float64)
    out = pool.map(tasks.where_indexed, range(40), itertools.repeat(big, 40), chunksize=2)
    assert [i for i, _ in out] == list(range(40))
    assert len({r[:2] for _, r in out}) == 1, "one shared copy for the whole map"
    assert not pymizu.is_shared(big), "the caller's array is left alone"


def test_a_map_sends_a_big_argument_bound_by_partial_once(pool):
    big = np.arange(BIG, dtype=np.float64)
    f = functools.partial(tasks.where_indexed, a=big)
    out = pool.map(f, range(40), chunksize=2)
    assert len({r[:2] for _, r in out}) == 1
    with pymizu.PoolExecutor(2) as ex:
        out = list(ex.map(tasks.where_indexed, range(40), itertools.repeat(big, 40), chunksize=2))
    assert len({r[:2] for _, r in out}) == 1


def _segment_exists(name: str) -> bool:
    return os.path.exists("/dev/shm/" + name.lstrip("/"))


def test_shared_memory_is_freed_after_the_last_holder_even_a_killed_one():
    # Larger than a store segment: the region gets a segment of its own, whose name goes
    # when the region is released.
    s = pymizu.share(np.ones(10 << 20, dtype=np.float64))
    name = _native.shared_region(s)[0]
    assert _segment_exists(name)
    with pymizu.Pool(1) as p:
        p.submit(tasks.remember, "kept", s).result(timeout=60)  # the worker holds a view
        del s
        gc.collect()
        time.sleep(0.2)
        assert _segment_exists(name), "the worker still holds it"
        pid = p.status()["workers"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while _segment_exists(name):
            assert time.monotonic() < deadline, "a killed holder's reference was not given back"
            time.sleep(0.05)


def test_empty_and_zeros_are_writable_arrays_in_shared_memory():
    z = pymizu.zeros((3, 4), dtype=np.int32)
    assert z.flags.writeable and pymizu.is_shared(z)
    assert z.shape == (3, 4) and z.dtype == np.int32 and not z.any()
    z[1, 2] = 7
    assert z[1, 2] == 7
    e = pymizu.empty(np.int64(5))
    assert e.shape == (5,) and e.dtype == np.float64 and e.flags.writeable
    assert pymizu.zeros((2, 3), order="F").flags.f_contiguous
    assert pymizu.zeros(0).size == 0
    with pytest.raises(ValueError, match="negative"):
        pymizu.zeros(-1)
    with pytest.raises(TypeError, match="object"):
        pymizu.zeros(3, dtype=object)
    with pytest.raises(ValueError, match="order"):
        pymizu.zeros(3, order="K")


def test_tasks_fill_a_shared_array_in_place(pool):
    out = pymizu.zeros((8, 1000))
    mine = region(out)
    # Plain arguments, a map with the array bound by `partial` (a pickled call), a starmap.
    for t in [pool.submit(tasks.fill_row, out, i, float(i)) for i in range(4)]:
        t.result(timeout=60)
    assert pool.map(functools.partial(tasks.fill_row, out), [4, 5], [4.0, 5.0]) == [4, 5]
    assert pool.starmap(tasks.fill_row, [(out, 6, 6.0), (out, 7, 7.0)]) == [6, 7]
    assert np.array_equal(out, np.repeat(np.arange(8.0), 1000).reshape(8, 1000))
    # The workers viewed this very memory.
    assert {pool.submit(tasks.where, out).result(timeout=60)[0][:2] for _ in range(4)} == {mine}
    # Small arrays and views of a part go by reference too (never by value).
    tiny = pymizu.zeros(4)
    pool.submit(tasks.fill_row, tiny.reshape(2, 2), 1, 3.0).result(timeout=60)
    assert tiny.tolist() == [0.0, 0.0, 3.0, 3.0]
    pool.submit(tasks.fill_row, out[2:4], 0, -2.0).result(timeout=60)
    assert (out[2] == -2.0).all() and (out[3] == 3.0).all()
    # Sent back, it is the same memory, still writable.
    back = pool.submit(tasks.ident, out).result(timeout=60)
    assert region(back) == mine and back.flags.writeable
    back[0, 0] = -1.0
    assert out[0, 0] == -1.0
    # What workers get is writable only for this memory: a shared copy stays read-only.
    assert pool.submit(tasks.describe, pymizu.zeros(10)).result(timeout=60)[3] is True
    assert pool.submit(tasks.describe, pymizu.share(np.arange(10.0))).result(timeout=60)[3] is False


def test_the_executor_passes_writable_arrays_by_reference():
    out = pymizu.zeros(6)
    with pymizu.PoolExecutor(2) as ex:
        list(ex.map(tasks.fill_row, [out] * 6, range(6), [1.0] * 6))
    assert out.tolist() == [1.0] * 6
