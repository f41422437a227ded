"""pymizu.PoolExecutor behaves as concurrent.futures.ProcessPoolExecutor (with real processes)."""

import asyncio
import concurrent.futures as cf
import functools
import os
import time
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

import pymizu
import tasks


@pytest.fixture(scope="module")
def ex():
    with pymizu.PoolExecutor(2) as e:
        yield e


def test_submit_returns_a_real_future_with_the_result(ex):
    f = ex.submit(tasks.add, 2, 3)
    assert isinstance(f, cf.Future)
    assert f.result(timeout=60) == 5


def test_a_partial_runs_as_the_call_it_makes(ex):
    # (As `loop.run_in_executor(ex, partial(f, key=v))` submits: the partial's function travels
    # by reference with the arguments joined, as partial joins them.)
    p = functools.partial(tasks.signature, 1, 2, a=3, b=4)
    assert ex.submit(p).result(timeout=60) == p()
    assert ex.submit(p, 5, b=6, c=7).result(timeout=60) == ((1, 2, 5), [("a", 3), ("b", 6), ("c", 7)])
    nested = functools.partial(functools.partial(tasks.signature, "x", k=1), "y", k=2)
    assert ex.submit(nested, "z").result(timeout=60) == (("x", "y", "z"), [("k", 2)])
    big = np.arange(100_000.0)
    assert ex.submit(functools.partial(np.sum, big)).result(timeout=60) == big.sum()
    assert ex.submit(functools.partial(lambda a, b: a - b, 10), 3).result(timeout=60) == 7
    own = tasks.Partial(tasks.signature, 1)
    assert ex.submit(own, 2).result(timeout=60) == ("own", ((1, 2), []))
    with pytest.raises(TypeError):
        ex.submit(functools.partial(tasks.add, 1), 2, 3).result(timeout=60)
    assert list(ex.map(functools.partial(tasks.add, 10), range(3))) == [10, 11, 12]


def test_running_says_a_worker_has_taken_the_task():
    import multiprocessing as mp

    ev = mp.get_context("spawn").Event()
    with pymizu.PoolExecutor(1) as e:
        f = e.submit(tasks.wait_event, ev)
        deadline = time.monotonic() + 60
        while not f.running():
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.001)
        assert "state=running" in repr(f)
        queued = e.submit(tasks.add, 1, 1)
        assert not queued.running() and not queued.done(), "the only worker is busy"
        assert "state=pending" in repr(queued)
        assert not f.cancel(), "a running task cannot be cancelled"
        ev.set()
        assert f.result(timeout=60) is True
        assert not f.running() and f.done()
        assert "state=finished returned bool" in repr(f)
        assert queued.result(timeout=60) == 2 and not queued.running()


def test_map_keeps_order(ex):
    assert list(ex.map(tasks.add, range(100), range(100), timeout=60)) == [2 * i for i in range(100)]


def test_map_hands_out_its_elements_without_keeping_them(ex):
    import gc
    import weakref

    # 2 000 elements: chunks of many elements each, every one of which is let go as it is
    # handed out, not when its chunk is done.
    it = ex.map(tasks.make_object, range(2000), timeout=60)
    assert iter(it) is it
    n = 0
    for obj in it:  # (not `enumerate`: its reused tuple holds the last element)
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        assert ref() is None, f"element {n} is still held by the iterator"
        n += 1
    assert n == 2000
    with pytest.raises(StopIteration):
        next(it)


def test_a_map_fails_at_its_first_failing_element_then_is_finished(ex):
    it = ex.map(tasks.fails_at, range(1000), [637] * 1000, timeout=60)
    got = []
    with pytest.raises(KeyError):
        for x in it:
            got.append(x)
    # Every chunk before the failing one's, in order (the failing chunk fails as a whole, as
    # with ProcessPoolExecutor's chunks); then nothing more.
    assert 0 < len(got) <= 637 and got == list(range(len(got)))
    assert list(it) == [], "a map that raised yields nothing more"


def test_closing_a_map_early_cancels_the_chunks_not_collected(tmp_path):
    gate = str(tmp_path / "gate")
    n = 50
    with pymizu.PoolExecutor(1) as e:
        # One element a chunk: the first returns, the second (once the worker takes it) holds
        # the only worker at the gate, the rest wait behind it.
        it = e.map(tasks.mark_past_gate, [str(tmp_path)] * n, [gate] * n, range(n), chunksize=1)
        assert next(it) == 0
        it.close()
        assert list(it) == []
        open(gate, "w").close()
        assert e.submit(tasks.add, 1, 2).result(timeout=60) == 3
    ran = sorted(int(p.name) for p in tmp_path.iterdir() if p.name != "gate")
    # (The second call ran if the worker took it before `close`, which cannot cancel it.)
    assert ran in ([0], [0, 1]), f"calls that ran after the map was closed: {ran}"


def test_workers_are_other_processes(ex):
    pids = {ex.submit(tasks.pid).result(timeout=60) for _ in range(20)}
    assert os.getpid() not in pids


def test_an_exception_is_reraised_as_its_own_type_with_the_remote_traceback(ex):
    with pytest.raises(ValueError, match="no good") as info:
        ex.submit(tasks.boom, "no good").result(timeout=60)
    assert "boom" in str(info.value.__cause__), "the remote traceback is the cause"
    assert ex.submit(tasks.add, 1, 1).result(timeout=60) == 2, "the pool goes on"


def test_an_unpicklable_exception_becomes_a_task_error(ex):
    with pytest.raises(pymizu.TaskError, match="Unpicklable"):
        ex.submit(tasks.raise_unpicklable).result(timeout=60)


def test_unpicklable_arguments_fail_their_future_never_hang(ex):
    import threading

    f = ex.submit(tasks.add, threading.Lock(), 2)
    with pytest.raises(TypeError, match="pickle"):
        f.result(timeout=60)
    assert ex.submit(tasks.add, 1, 2).result(timeout=60) == 3


def test_lambdas_and_local_functions_travel_through_cloudpickle(ex):
    k = 10
    assert ex.submit(lambda x: x + k, 5).result(timeout=60) == 15


def test_large_results_travel(ex):
    assert len(ex.submit(tasks.big, 3_000_000).result(timeout=60)) == 3_000_000


def test_wait_as_completed_and_asyncio(ex):
    fs = [ex.submit(tasks.sleep, 0.01 * (i % 3)) for i in range(9)]
    done, not_done = cf.wait(fs, timeout=60)
    assert len(done) == 9 and not not_done
    fs = [ex.submit(tasks.add, i, 0) for i in range(20)]
    assert sorted(f.result() for f in cf.as_completed(fs, timeout=60)) == list(range(20))

    async def main():
        return await asyncio.wrap_future(ex.submit(tasks.add, 20, 22))

    assert asyncio.run(main()) == 42


def test_a_dead_worker_breaks_the_executor_as_with_process_pool_executor():
    with pymizu.PoolExecutor(2) as e:
        assert e._broken is False
        running = e.submit(tasks.sleep, 30)
        deadline = time.monotonic() + 60
        while not any(row[3] for row in e._status()):  # it runs on one worker
            assert time.monotonic() < deadline, "hang guard"
            time.sleep(0.001)
        with pytest.raises(BrokenProcessPool) as info:
            e.submit(tasks.die).result(timeout=60)  # on the other worker
        assert isinstance(info.value, pymizu.WorkerDiedError)
        assert info.value.pid > 0
        assert e._broken
        with pytest.raises(BrokenProcessPool) as info:  # pending work fails too
            running.result(timeout=60)
        assert not isinstance(info.value, pymizu.WorkerDiedError)
        with pytest.raises(BrokenProcessPool):
            e.submit(tasks.add, 2, 2)


def test_an_idle_worker_that_dies_breaks_the_executor_while_someone_waits():
    import signal

    with pymizu.PoolExecutor(2) as e:
        # Two tasks in flight start the second worker (workers start as work needs them);
        # then both are idle.
        for f in [e.submit(tasks.sleep, 0.2) for _ in range(2)]:
            f.result(timeout=60)
        assert len(e._processes) == 2
        busy = e.submit(tasks.sleep, 30)
        deadline = time.monotonic() + 60
        while not any(row[3] for row in e._status()):
            assert time.monotonic() < deadline, "hang guard"
            time.sleep(0.001)
        idle = [row[1] for row in e._status() if not row[3]]
        os.kill(idle[0], signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            busy.result(timeout=60)


def test_a_plain_pool_replaces_a_dead_worker_and_goes_on():
    with pymizu.Pool(1) as p:
        with pytest.raises(pymizu.WorkerDiedError):
            p.submit(tasks.die).result(timeout=60)
        assert p.submit(tasks.add, 2, 2).result(timeout=60) == 4, "replaced, still serving"


def test_execution_timeout_kills_and_replaces_the_worker():
    with pymizu.PoolExecutor(1, exec_timeout=0.3) as e:
        with pytest.raises(pymizu.ExecTimeoutError):
            e.submit(tasks.sleep, 60).result(timeout=60)
        assert e.submit(tasks.add, 1, 2).result(timeout=60) == 3


def test_shutdown_cancel_futures_cancels_queued_work():
    e = pymizu.PoolExecutor(1)
    running = e.submit(tasks.sleep, 0.5)
    import time

    deadline = time.monotonic() + 60
    while not any(row[3] for row in e._status()):  # the first task has started
        assert time.monotonic() < deadline, "hang guard"
        time.sleep(0.001)
    queued = [e.submit(tasks.add, i, 0) for i in range(50)]
    e.shutdown(wait=True, cancel_futures=True)
    assert running.result(timeout=60) == 0.5
    assert any(f.cancelled() for f in queued)
    assert all(f.cancelled() or f.result(timeout=60) == i for i, f in enumerate(queued))
    with pytest.raises(RuntimeError):
        e.submit(tasks.add, 1, 1)


def test_shutdown_cancel_futures_right_after_submitting_lets_the_oldest_run():
    # As with ProcessPoolExecutor, whose oldest calls are in its workers' queue by then: the
    # oldest pending futures, one per worker, run whether or not a worker took them in time.
    for _ in range(3):
        e = pymizu.PoolExecutor(2)
        fs = [e.submit(tasks.sleep, 0.05) for _ in range(50)]
        e.shutdown(wait=True, cancel_futures=True)
        assert [f.result(timeout=60) for f in fs[:2]] == [0.05, 0.05]
        assert sum(f.cancelled() for f in fs) >= 40
        assert all(f.cancelled() or f.result(timeout=60) == 0.05 for f in fs)


def test_callbacks_run_without_anyone_waiting(ex):
    got = []
    import threading

    ev = threading.Event()
    f = ex.submit(tasks.add, 3, 4)
    f.add_done_callback(lambda fut: (got.append(fut.result()), ev.set()))
    assert ev.wait(60)
    assert got == [7]


def test_no_shared_memory_is_left_after_shutdown():
    def mine():
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"mizu_{os.getpid():x}_") and not n.endswith(".lock")}

    before = mine()  # the module's shared executor is alive: its segments are not ours to judge
    e = pymizu.PoolExecutor(2)
    e.submit(tasks.big, 1_000_000).result(timeout=60)
    e.submit(tasks.add, b"y" * 100_000, b"z").result(timeout=60)
    e.shutdown()
    assert mine() - before == set()


def test_a_map_larger_than_the_slot_table_waits_instead_of_failing(ex):
    n = 10_000  # more than the 4096 task slots of a submitter
    assert list(ex.map(tasks.add, range(n), range(n), timeout=120)) == [2 * i for i in range(n)]


def test_done_becomes_true_without_anyone_calling_result(ex):
    import time

    f = ex.submit(tasks.add, 1, 2)
    deadline = time.monotonic() + 60
    while not f.done():
        assert time.monotonic() < deadline, "hang guard"
        time.sleep(0.001)
    assert f.result() == 3


def test_futures_settled_by_their_caller_while_other_threads_watch_them(ex):
    # A future is settled without a condition variable until some other thread looks at it;
    # callbacks, wait() and result() from other threads must never miss the outcome.
    import threading
    from concurrent.futures import wait

    for _ in range(200):
        f = ex.submit(tasks.add, 1, 2)
        seen = []
        done = threading.Event()

        def watch():
            f.add_done_callback(lambda g: seen.append(g.result()))
            wait([f], timeout=60)
            seen.append(f.result(timeout=60))
            done.set()

        t = threading.Thread(target=watch)
        t.start()
        assert f.result(timeout=60) == 3
        assert done.wait(60)
        t.join(60)
        assert seen == [3, 3]


def test_as_completed_yields_each_future_once_while_a_caller_settles_them(ex):
    # The caller's thread and the collector may both settle a future; a waiter must be told
    # once (as_completed fails on a future it is told about twice).
    import threading
    from concurrent.futures import FIRST_COMPLETED, as_completed, wait

    for _ in range(5):
        futs = [ex.submit(tasks.add, i, 0) for i in range(300)]
        caller = threading.Thread(target=lambda: [f.result(timeout=60) for f in futs])
        caller.start()
        got = sorted(f.result() for f in as_completed(futs, timeout=60))
        caller.join(60)
        assert got == list(range(300))
        left = set(ex.submit(tasks.add, i, 1) for i in range(50))
        while left:
            done, left = wait(left, timeout=60, return_when=FIRST_COMPLETED)
            assert done


def test_submits_racing_shutdown_either_complete_or_are_refused():
    import threading
    from concurrent.futures import wait

    for _ in range(5):
        ex = pymizu.PoolExecutor(2)
        accepted, refused = [], []
        go = threading.Event()

        def submitter():
            go.wait()
            for i in range(200):
                try:
                    accepted.append((i, ex.submit(tasks.add, i, 1)))
                except RuntimeError as e:
                    assert "after shutdown" in str(e)
                    refused.append(i)
                    return

        ts = [threading.Thread(target=submitter) for _ in range(3)]
        for t in ts:
            t.start()
        go.set()
        ex.shutdown(wait=True)
        for t in ts:
            t.join(60)
        # Every accepted future finishes, also for waiters other than its own caller.
        done, not_done = wait([f for _, f in accepted], timeout=60)
        assert not not_done
        assert all(f.result() == i + 1 for i, f in accepted)


def test_a_worker_whose_exit_status_someone_else_collected_still_fails_its_task():
    # Test harnesses (CPython's `support.reap_children`) and SIGCHLD handlers call
    # `waitpid(-1)`, which can take a worker's exit status before the pool sees it.
    with pymizu.Pool(1) as p:
        t = p.submit(tasks.die_after, 0.2)
        deadline = time.monotonic() + 60
        while not t.done() and time.monotonic() < deadline:
            try:
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.0005)
        with pytest.raises(pymizu.WorkerDiedError):
            t.result(timeout=60)
        assert p.submit(tasks.add, 1, 1).result(timeout=60) == 2


@pytest.mark.parametrize("how", ["value", "exception", "done callback", "attribute", "asyncio"])
def test_cycles_through_futures_are_collected(ex, how):
    # Futures start untracked by the garbage collector; whatever is stored in them that could
    # refer back (a value the caller extends, a kept exception, a callback, an attribute, an
    # asyncio wrapper) makes them tracked again, so each cycle goes with the next collection.
    import gc
    import weakref

    def make():
        if how == "value":
            f = ex.submit(tasks.fresh_list, 1)
            f.result(timeout=60).append(f)
        elif how == "exception":
            f = ex.submit(tasks.fail_odd, 1)
            try:
                f.result(timeout=60)
            except ValueError as e:
                f.kept = e  # the traceback holds this frame, which holds `f`
        elif how == "done callback":
            f = ex.submit(tasks.add, 1, 1)
            f.add_done_callback(lambda _, f=f: f)
            f.result(timeout=60)
        elif how == "attribute":
            f = ex.submit(tasks.add, 1, 1)
            f.result(timeout=60)
            f.me = f
        else:

            async def wrap():
                w = asyncio.wrap_future(f)
                f.wrapper = w
                return await w

            f = ex.submit(tasks.add, 1, 1)
            assert asyncio.run(wrap()) == 2
        return weakref.ref(f)

    ref = make()
    gc.collect()
    assert ref() is None


def test_submit_takes_keywords_and_refuses_a_call_without_a_function(ex):
    # `submit` reads its arguments in place (a C function, not a method with *args).
    assert ex.submit(tasks.kw_pair, 1, b=2).result(timeout=60) == tasks.kw_pair(1, b=2)
    assert ex.submit(tasks.kw_pair, a=3, b=4).result(timeout=60) == tasks.kw_pair(3, b=4)
    with pytest.raises(TypeError):
        ex.submit()
    with pytest.raises(TypeError):
        ex.submit(fn=tasks.add)
    with pymizu.Pool(1) as p:
        assert p.submit(tasks.kw_pair, 5, b=6).result(timeout=60) == tasks.kw_pair(5, b=6)
        with pytest.raises(TypeError):
            p.submit()
    assert ex.submit.__name__ == "submit"


def test_a_futures_result_is_native_and_of_its_exact_class(ex):
    # The interpreter calls a native method directly only when the method's class is the
    # instance's exact type: each executor's future class has a `result` of its own.
    from pymizu import _futures, _native

    f = ex.submit(tasks.add, 1, 2)
    own = type(f).__dict__["result"]
    assert type(own).__name__ == "method_descriptor"
    assert own.__objclass__ is type(f)
    assert f.result(timeout=60) == 3
    assert f.result(None) == 3 and f.result(timeout=None) == 3
    with pymizu.PoolExecutor(1) as other:
        g = other.submit(tasks.add, 2, 2)
        assert type(g) is not type(f) and type(g).__dict__["result"].__objclass__ is type(g)
        assert g.result(timeout=60) == 4
    # Only subclasses of the installed future class take it.
    with pytest.raises(TypeError, match="already installed"):
        _native.install_future_result(type("Other", (cf.Future,), {"_result_py": cf.Future.result}))
    assert issubclass(type(f), _futures._MizuFuture)


def test_a_future_takes_attributes_of_its_users(ex):
    # Its own fields are slots; what a framework stores on it goes in its dictionary.
    f = ex.submit(tasks.add, 1, 2)
    f.key = ("x", 1)
    f.priority = 3
    assert f.result(timeout=60) == 3
    assert (f.key, f.priority) == (("x", 1), 3)
    assert vars(f) == {"key": ("x", 1), "priority": 3}
    g = ex.submit(tasks.add, 2, 2)
    g.key = "y"
    assert cf.wait([g], timeout=60).done == {g}
    assert g.result() == 4 and g.key == "y"


def test_settled_futures_leave_the_executor(ex):
    fs = [ex.submit(tasks.add, i, 1) for i in range(200)]
    fs += [ex.submit(tasks.fail_with, "no") for _ in range(5)]
    assert [f.result(timeout=60) for f in fs[:200]] == [i + 1 for i in range(200)]
    assert all(isinstance(f.exception(timeout=60), Exception) for f in fs[200:])
    pending = ex._state.pending
    assert len(pending) == 0 and not any(f in pending for f in fs)
    assert list(pending) == []


def test_the_pending_set_keeps_each_future_once_in_submission_order(ex):
    from pymizu import _native

    running = ex.submit(tasks.sleep, 0.2)
    s = _native.PendingSet()
    # A future its executor still holds as pending is in no other set.
    with pytest.raises(ValueError, match="another executor"):
        s.add(running)
    assert running not in s and running in ex._state.pending
    fs = [ex.submit(tasks.add, i, 1) for i in range(6)]
    assert [f.result(timeout=60) for f in fs] == [i + 1 for i in range(6)]
    for f in fs + fs[:2]:  # added twice: still once
        s.add(f)
    assert len(s) == 6 and all(f in s for f in fs)
    s.discard(fs[1])
    s.discard(fs[1])  # not there: nothing happens
    s.add(fs[1])  # a freed place is reused; the order is that of the additions
    assert len(s) == 6 and s.in_order() == [fs[0]] + fs[2:] + [fs[1]]
    with pytest.raises(TypeError):
        s.add(object())
    assert object() not in s
    s.discard(object())
    for f in fs:
        s.discard(f)
    assert len(s) == 0 and list(s) == [] and not any(f in s for f in fs)
    assert running.result(timeout=60) == 0.2 and running not in ex._state.pending


def test_futures_nobody_keeps_are_let_go_once_their_tasks_return():
    # Submitting without keeping the futures (a service's fire-and-forget work) must not keep
    # every future until shutdown: ProcessPoolExecutor drops its work items as they finish.
    with pymizu.PoolExecutor(1) as ex:
        kept, called = [], []
        for i in range(4092):
            f = ex.submit(tasks.add, i, 1)
            if i % 500 == 0:
                kept.append(f)
        ex.submit(tasks.fail_with, "nobody keeps this one")  # failed: settled, then let go
        failing = ex.submit(tasks.fail_with, "kept for its exception")
        del f
        # One worker runs its tasks in order: once this one is back, every earlier one is.
        assert ex.submit(tasks.add, 1, 1).result(timeout=60) == 2
        assert len(ex._state.pending) == 4094
        before = ex.submit(tasks.add, 2, 1)  # the set reaches 4 095 ...
        assert len(ex._state.pending) == 4095
        last = ex.submit(tasks.add, 2, 2)  # ... and 4 096: it looks
        pending = ex._state.pending
        # Kept: the futures referred to elsewhere.
        assert len(pending) == len(kept) + 3, len(pending)
        assert all(f in pending for f in [last, before, failing, *kept])
        assert before.result(timeout=60) == 3
        assert [f.result(timeout=60) for f in kept] == [i + 1 for i in range(0, 4092, 500)]
        assert last.result(timeout=60) == 4
        assert "kept for its exception" in str(failing.exception(timeout=60))
        g = ex.submit(tasks.add, 3, 3)
        g.add_done_callback(lambda fut: called.append(fut.result()))
        del g
        for _ in range(200):  # (the collector runs it: wait for it, bounded)
            if called:
                break
            time.sleep(0.05)
        assert called == [6]


def test_failed_futures_nobody_keeps_are_settled_and_let_go():
    with pymizu.PoolExecutor(1) as ex:
        for i in range(9999):
            ex.submit(tasks.fail_with, f"failure {i}")
        last = ex.submit(tasks.fail_with, "the last")
        # One worker runs its tasks in order: once this one fails, every earlier one has.
        assert "the last" in str(last.exception(timeout=60))
        # Each look (at 4 096 pending) settled the failed ones and let them go.
        assert len(ex._state.pending) < 4096, len(ex._state.pending)
        assert ex.submit(tasks.add, 1, 1).result(timeout=60) == 2


def test_an_initializer_failure_breaks_the_executor_also_when_nobody_keeps_the_futures():
    # As a ProcessPoolExecutor, whose submit raises BrokenProcessPool once its initializer
    # failed, whether or not anyone kept the futures.
    with pymizu.PoolExecutor(1, initializer=tasks.init_fail) as ex:
        first = ex.submit(tasks.add, 0, 1)
        assert first._task._outcome(60) is not None  # the worker is up (the future unread)
        for i in range(4092):
            ex.submit(tasks.add, i, 1)
        last = ex.submit(tasks.add, 1, 1)
        assert last._task._outcome(60) is not None  # in order: every earlier one failed
        del last
        assert len(ex._state.pending) == 4094
        ex.submit(tasks.add, 2, 1)  # 4 095 ...
        with pytest.raises(BrokenProcessPool):
            ex.submit(tasks.add, 2, 2)  # ... and 4 096: the look settles the failures
        with pytest.raises(BrokenProcessPool):
            first.result(timeout=60)
