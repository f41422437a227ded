"""`Pool.submit_batch`: calls travel in chunks, and each call keeps its own outcome — values,
exceptions, results that cannot be pickled, cancellation, a dying worker — with real workers."""

import gc
import os
import weakref

import pytest

import pymizu
import tasks


@pytest.fixture(scope="module")
def pool():
    with pymizu.Pool(2) as p:
        yield p


@pytest.mark.parametrize("chunksize", [None, 1, 2, 7, 1000])
def test_values_in_order_for_any_chunk_size(pool, chunksize):
    ts = pool.submit_batch(tasks.add, [(i, 1) for i in range(1000)], chunksize=chunksize)
    assert len(ts) == 1000
    assert pool.collect_all(ts, timeout=60) == [i + 1 for i in range(1000)]
    # Read again, one by one and out of order: the outcome is kept.
    assert [t.result(0) for t in reversed(ts)] == [i + 1 for i in reversed(range(1000))]
    assert all(t.done() and not t.cancelled() for t in ts)


def test_argument_lists_iterators_and_empty_batches(pool):
    ts = pool.submit_batch(tasks.add, iter([[i, i] for i in range(50)]))
    assert pool.collect_all(ts, timeout=60) == [2 * i for i in range(50)]
    assert pool.submit_batch(tasks.add, []) == []
    assert pool.collect_all([]) == []


def test_functions_that_travel_by_value(pool):
    k = 3
    ts = pool.submit_batch(lambda x: x * k, [(i,) for i in range(300)])
    assert pool.collect_all(ts, timeout=60) == [3 * i for i in range(300)]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True])
def test_bad_chunksize(pool, bad):
    with pytest.raises(ValueError, match="chunksize"):
        pool.submit_batch(tasks.add, [(1, 1)], chunksize=bad)


def test_a_call_that_raises_fails_alone(pool):
    ts = pool.submit_batch(tasks.fail_odd, [(i,) for i in range(200)], chunksize=50)
    for i, t in enumerate(ts):
        if i % 2:
            e = t.exception(timeout=60)
            assert isinstance(e, ValueError) and str(e) == f"odd {i}"
            assert isinstance(e.__cause__, pymizu.RemoteTraceback)
            assert "fail_odd" in str(e.__cause__)
            with pytest.raises(ValueError, match=f"odd {i}") as info:
                t.result(0)
            assert info.value is e  # the same exception every time
        else:
            assert t.result(timeout=60) == i
    with pytest.raises(ValueError, match="odd 1"):
        pool.collect_all(ts, timeout=60)


def test_stopiteration_and_systemexit_fail_their_call_alone(pool):
    # Neither ends the chunk early nor stops its worker: the calls after them run.
    ts = pool.submit_batch(tasks.stop_at, [(i, 7) for i in range(20)], chunksize=20)
    for i, t in enumerate(ts):
        if i in (7, 8):
            e = t.exception(timeout=60)
            assert type(e) is (StopIteration if i == 7 else SystemExit) and e.args == (i,)
            assert "stop_at" in str(e.__cause__)
        else:
            assert t.result(timeout=60) == i
    assert pool.collect_all(pool.submit_batch(tasks.add, [(i, 1) for i in range(50)]), timeout=60) == [
        i + 1 for i in range(50)
    ]


def test_a_result_that_cannot_be_pickled_fails_alone(pool):
    ts = pool.submit_batch(tasks.lock_at, [(i, 5) for i in range(20)], chunksize=20)
    for i, t in enumerate(ts):
        if i == 5:
            with pytest.raises(Exception, match="lock"):
                t.result(timeout=60)
        else:
            assert t.result(timeout=60) == i


def test_cancel_a_call_of_a_queued_chunk(tmp_path):
    gate = tmp_path / "open"
    ran = tmp_path / "ran"
    ran.mkdir()
    with pymizu.Pool(1) as p:
        blocker = p.submit(tasks.wait_for, str(gate))
        ts = p.submit_batch(tasks.mark, [(str(ran), i) for i in range(10)], chunksize=5)
        assert ts[2].cancel() and ts[2].cancel()  # the chunk had not started
        assert ts[2].cancelled() and ts[2].done()
        assert ts[7].cancel()
        assert ts[8].cancel()
        gate.touch()
        assert blocker.result(timeout=120)
        with pytest.raises(pymizu.CancelledError):
            ts[2].result(timeout=60)
        left = [i for i in range(10) if i not in (2, 7, 8)]
        assert [ts[i].result(timeout=60) for i in left] == left
        assert sorted(int(f) for f in os.listdir(ran)) == left  # the cancelled never ran
        assert not ts[3].cancel()  # finished
        assert not ts[3].cancelled()


def test_cancel_every_call_of_a_chunk(tmp_path):
    gate = tmp_path / "open"
    with pymizu.Pool(1) as p:
        blocker = p.submit(tasks.wait_for, str(gate))
        ts = p.submit_batch(tasks.add, [(i, 0) for i in range(4)], chunksize=4)
        assert all(t.cancel() for t in ts)
        gate.touch()
        assert blocker.result(timeout=120)
        for t in ts:
            with pytest.raises(pymizu.CancelledError):
                t.result(timeout=60)
        # The pool serves on.
        assert p.collect_all(p.submit_batch(tasks.add, [(1, 1)] * 10), timeout=60) == [2] * 10


def test_a_worker_that_dies_fails_its_chunk_and_the_pool_serves_on():
    with pymizu.Pool(2) as p:
        ts = p.submit_batch(tasks.die_at, [(i, 13) for i in range(40)], chunksize=10)
        outcomes = []
        for t in ts:
            e = t.exception(timeout=120)
            outcomes.append(type(e) if e is not None else t.result(0))
        assert outcomes[10:20] == [pymizu.WorkerDiedError] * 10
        assert outcomes[:10] + outcomes[20:] == list(range(10)) + list(range(20, 40))
        assert p.collect_all(p.submit_batch(tasks.add, [(i, 1) for i in range(100)]), timeout=60) == [
            i + 1 for i in range(100)
        ]


def test_waiting_on_calls_of_a_chunk(pool):
    ts = pool.submit_batch(tasks.add, [(i, 0) for i in range(64)], chunksize=16)
    done = pool.collect_any(ts, timeout=60)
    assert done.done()
    assert pymizu._native.wait_any(ts, 60) is not None
    import asyncio

    async def main():
        return [await t for t in ts[:20]]

    assert asyncio.run(main()) == list(range(20))


def test_stopping_fails_queued_calls(tmp_path):
    gate = tmp_path / "open"
    p = pymizu.Pool(1)
    blocker = p.submit(tasks.wait_for, str(gate))
    ts = p.submit_batch(tasks.add, [(i, 0) for i in range(20)], chunksize=5)
    p.stop(grace=0.1)
    for t in [blocker, *ts]:
        with pytest.raises((pymizu.StoppedError, pymizu.CancelledError, pymizu.WorkerDiedError)):
            t.result(timeout=60)


@pytest.mark.parametrize("how", ["calls of one chunk", "submit", "batch of one-call tasks"])
def test_cycles_through_tasks_are_collected(pool, how):
    # A value the caller makes refer to its task, and a kept exception whose traceback holds
    # the list of tasks: both cycles go with the next collection.
    def submit_all(fn, argss):
        if how == "calls of one chunk":
            return pool.submit_batch(fn, argss, chunksize=len(argss))
        if how == "submit":
            return [pool.submit(fn, *a) for a in argss]
        return pool.submit_batch(fn, argss, chunksize=1)

    # New tasks reuse the memory of freed ones (the type keeps a free list): free some first,
    # so that the tasks below are such reused ones, weak references and all.
    freed = submit_all(tasks.add, [(i, 0) for i in range(50)])
    assert pool.collect_all(freed) == list(range(50))
    freed = [weakref.ref(t) for t in freed]
    assert all(r() is None for r in freed)

    ts = submit_all(tasks.fresh_list, [(i,) for i in range(4)])
    assert not any(gc.is_tracked(t) for t in ts)
    v = ts[3].result(timeout=60)
    v.append(ts[3])
    ref = weakref.ref(ts[3])
    del ts, v
    gc.collect()
    assert ref() is None

    def keep_exception():
        ts = submit_all(tasks.fail_odd, [(i,) for i in range(4)])
        try:
            ts[1].result(timeout=60)
        except ValueError as e:
            return weakref.ref(ts[1]), e

    ref, e = keep_exception()
    del e
    gc.collect()
    assert ref() is None
