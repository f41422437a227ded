"""Every way of waiting for a PoolExecutor future or a Pool task is woken by the completion
itself: `as_completed`, `wait`, done-callbacks, `asyncio.wrap_future`, `run_in_executor` and
`await task` — and nothing polls while nothing is pending."""

import asyncio
import concurrent.futures as cf
import os
import threading
import time

import pytest

import pymizu
import tasks


@pytest.fixture
def ex():
    with pymizu.PoolExecutor(1) as e:
        yield e


def test_an_idle_collector_makes_no_rounds(ex):
    for i in range(20):
        assert ex.submit(tasks.add, i, 1).result(timeout=60) == i + 1
    f = ex.submit(tasks.add, 1, 1)
    cf.wait([f], timeout=60)
    time.sleep(0.05)
    before = ex._collector_rounds
    time.sleep(0.3)
    # No timer: with nothing watched, the collector sleeps until it is kicked.
    assert ex._collector_rounds == before


def test_a_done_callback_runs_when_the_task_finishes_not_on_a_timer(ex):
    ran = []
    done = threading.Event()
    f = ex.submit(tasks.sleep, 0.4)
    before = ex._collector_rounds
    f.add_done_callback(lambda fut: (ran.append(threading.current_thread().name), done.set()))
    assert done.wait(60)
    assert ran == ["pymizu-collector"]
    # It waited for the pool's wake-up: a few bounded waits, not a polling loop (a 200 us
    # poll would have made ~2000 rounds in 0.4 s).
    assert ex._collector_rounds - before < 30


def test_a_raising_done_callback_is_logged_and_the_others_still_run(ex, caplog):
    ran = []
    done = threading.Event()

    def bad(fut):
        raise ZeroDivisionError("in a callback")

    f = ex.submit(tasks.sleep, 0.2)
    f.add_done_callback(bad)
    f.add_done_callback(lambda fut: (ran.append(fut.result()), done.set()))
    with caplog.at_level("ERROR", logger="concurrent.futures"):
        assert done.wait(60)
        g = ex.submit(tasks.add, 1, 1)
        assert g.result(timeout=60) == 2
        g.add_done_callback(bad)  # finished already: runs (and fails) in this thread
    assert ran == [0.2]
    logged = [r for r in caplog.records if r.name == "concurrent.futures"]
    assert len(logged) == 2
    assert all("exception calling callback" in r.getMessage() for r in logged)
    assert all(r.exc_info[0] is ZeroDivisionError for r in logged)
    assert not f.cancelled() and f.exception() is None


def test_as_completed_and_wait_see_completions_in_order(ex):
    slow = ex.submit(tasks.sleep, 0.5)
    with pymizu.PoolExecutor(1) as other:
        fast = other.submit(tasks.add, 1, 2)
        order = [f for f in cf.as_completed([slow, fast], timeout=60)]
        assert order[0] is fast and order[1] is slow
    f = ex.submit(tasks.sleep, 0.2)
    done, not_done = cf.wait([f], timeout=60, return_when=cf.FIRST_COMPLETED)
    assert done == {f} and not not_done


def test_short_tasks_are_already_finished_when_a_waiter_looks(ex):
    # The first waiter other than result() looks for the outcome itself for a moment: a
    # trivial task's future is finished by then, so as_completed needs no wake-up at all.
    for _ in range(50):
        f = ex.submit(tasks.add, 2, 2)
        (got,) = list(cf.as_completed([f], timeout=60))
        assert got.result() == 4


def test_asyncio_paths(ex):
    async def main():
        loop = asyncio.get_running_loop()
        a = await asyncio.wrap_future(ex.submit(tasks.add, 1, 1))
        b = await loop.run_in_executor(ex, tasks.add, 2, 2)
        slow = await asyncio.wrap_future(ex.submit(tasks.sleep, 0.2))
        return a, b, slow

    assert asyncio.run(main()) == (2, 4, 0.2)


def test_awaiting_pool_tasks():
    with pymizu.Pool(1) as p:

        async def main():
            quick = [await p.submit(tasks.add, i, i) for i in range(20)]
            slow = await p.submit(tasks.sleep, 0.2)
            both = await asyncio.gather(p.submit(tasks.add, 1, 1), p.submit(tasks.sleep, 0.1))
            return quick, slow, both

        quick, slow, both = asyncio.run(main())
        assert quick == [2 * i for i in range(20)]
        assert slow == 0.2 and both == [2, 0.1]


def test_a_cancelled_future_seen_by_a_waiter(ex):
    blocker = ex.submit(tasks.sleep, 0.3)
    queued = ex.submit(tasks.add, 1, 1)
    if queued.cancel():
        done, _ = cf.wait([queued], timeout=60)
        assert done == {queued} and queued.cancelled()
        assert queued.cancel()  # again: still cancelled, no error
    assert blocker.result(timeout=60) == 0.3


def test_many_finished_futures_reach_every_waiter_once_with_their_outcomes(ex):
    # Values are settled natively when a waiter first looks, exceptions through the Python
    # methods: both kinds, through `as_completed`, `wait` and `done()`, each exactly once.
    for how in ("as_completed", "wait", "done"):
        fs = [ex.submit(tasks.fail_odd, i) for i in range(400)]
        if how == "as_completed":
            seen = list(cf.as_completed(fs, timeout=60))
        elif how == "wait":
            done, not_done = cf.wait(fs, timeout=60)
            assert not not_done
            seen = list(done)
        else:
            while not all(f.done() for f in fs):
                time.sleep(0.001)
            seen = fs
        assert len(seen) == len(fs) and set(seen) == set(fs)
        for i, f in enumerate(fs):
            if i % 2:
                assert isinstance(f.exception(), ValueError) and str(f.exception()) == f"odd {i}"
            else:
                assert f.exception() is None and f.result() == i
        assert len(ex._state.pending) == 0, "every settled future left the pending set"


def test_futures_finished_before_anyone_waits_make_no_condition_per_future(ex, monkeypatch):
    # `wait` and `as_completed` take every future's condition and install a waiter on each;
    # a future already finished then makes none of its own (a condition per future, kept
    # with its future, was most of their cost over a batch), and still behaves as a finished
    # future does under every kind of wait. A pending one gets a real condition.
    made = []
    real = threading.Condition

    def counted(*a, **k):
        made.append(1)
        return real(*a, **k)

    fs = [ex.submit(tasks.add, i, 1) for i in range(300)]
    assert [f.result(timeout=60) for f in fs] == [i + 1 for i in range(300)]
    monkeypatch.setattr(threading, "Condition", counted)
    assert set(cf.as_completed(fs, timeout=60)) == set(fs)
    done, not_done = cf.wait(fs, timeout=60)
    assert done == set(fs) and not not_done
    done, _ = cf.wait(fs, timeout=60, return_when=cf.FIRST_COMPLETED)
    assert done == set(fs)
    # (Each `wait` and `as_completed` makes one event for its waiter; nothing per future.)
    assert len(made) <= 3, f"{len(made)} conditions made for 300 finished futures"
    called = []
    f = fs[0]
    f.add_done_callback(called.append)
    assert called == [f]
    with f._condition:
        assert f._condition.wait_for(f.done, timeout=0.1)
        f._condition.notify_all()
    assert not f.cancel() and not f.cancelled() and f.result() == 1
    for f in fs:
        f._waiters.append(object())
        assert len(f._waiters) == 0 and f._cond is None and f._waiter_list is None
    monkeypatch.setattr(threading, "Condition", real)
    # Mixed with a pending future: the finished ones first, then the slow one, whose
    # condition is real and whose waiters are all removed again.
    slow = ex.submit(tasks.sleep, 0.3)
    got = list(cf.as_completed(fs[:10] + [slow], timeout=60))
    assert set(got[:10]) == set(fs[:10]) and got[10] is slow
    assert isinstance(slow._condition, real) and len(slow._waiters) == 0
    assert slow.result() == 0.3


def test_wait_and_as_completed_settle_their_futures_themselves(ex):
    # A thread in `wait` or `as_completed` waits where the pool's outcomes wake it and settles
    # the future itself: the collector thread (which must be woken first) makes no round.
    for how in ("wait", "as_completed"):
        f = ex.submit(tasks.sleep, 0.3)
        time.sleep(0.05)
        before = ex._collector_rounds
        if how == "wait":
            done, _ = cf.wait([f], timeout=60)
            assert done == {f}
        else:
            assert list(cf.as_completed([f], timeout=60)) == [f]
        assert f.result() == 0.3
        assert ex._collector_rounds == before


def test_a_waiter_on_a_pending_task_is_woken_by_a_future_of_another_kind(ex):
    # `wait` parks on the pool for the pymizu future; a plain Future set by another thread
    # wakes it there (the slow task still runs when it returns).
    slow = ex.submit(tasks.sleep, 3)
    plain = cf.Future()
    timer = threading.Timer(0.2, plain.set_result, (7,))
    timer.start()
    done, not_done = cf.wait([slow, plain], timeout=60, return_when=cf.FIRST_COMPLETED)
    assert done == {plain} and not_done == {slow}


def test_a_waiter_across_executors_and_all_completed(ex):
    with pymizu.PoolExecutor(1) as other:
        slow = ex.submit(tasks.sleep, 3)
        fast = other.submit(tasks.sleep, 0.2)
        done, not_done = cf.wait([slow, fast], timeout=60, return_when=cf.FIRST_COMPLETED)
        assert done == {fast} and not_done == {slow}
        # Every one of several futures, settled by the waiting thread as each finishes.
        fs = [other.submit(tasks.add, i, 1) for i in range(20)]
        done, not_done = cf.wait(fs, timeout=60)
        assert done == set(fs) and not not_done
        assert [f.result() for f in fs] == [i + 1 for i in range(20)]
        # A timeout still times out, with the future unfinished.
        longer = other.submit(tasks.sleep, 1)
        done, not_done = cf.wait([longer], timeout=0.05)
        assert not done and not_done == {longer}
        assert longer.result(timeout=60) == 1


def test_a_future_settled_while_a_waiter_is_installed_is_reported_once():
    # Other threads settle futures (by `result()`, and the collector thread those with
    # callbacks) while `as_completed` and `wait` install their waiters: each future must count
    # either as finished when the waiter looked or as notified later, never both
    # (`as_completed` would yield it twice, or fail).
    with pymizu.PoolExecutor(2) as ex:
        for _ in range(4):
            fs = [ex.submit(tasks.sleep, 0.0001) for _ in range(2000)]
            for f in fs[::2]:
                f.add_done_callback(lambda _: None)
            reader = threading.Thread(target=lambda: [f.result(timeout=120) for f in fs[1::2]])
            reader.start()
            got = list(cf.as_completed(fs, timeout=120))
            reader.join()
            assert len(got) == len(fs) and set(got) == set(fs)
            fs = [ex.submit(tasks.sleep, 0.0001) for _ in range(2000)]
            reader = threading.Thread(target=lambda: [f.result(timeout=120) for f in fs[::-1]])
            reader.start()
            done, not_done = cf.wait(fs, timeout=120)
            reader.join()
            assert done == set(fs) and not not_done


def test_waiting_on_many_running_tasks_looks_for_their_outcome_once(monkeypatch):
    # A future's first waiter other than `result()` spins briefly for a short task's outcome;
    # once one such look finds its task still running, the other futures of the same
    # `as_completed`/`wait` are not looked at one by one.
    from pymizu import _futures

    looks = []
    real = _futures._look_for
    monkeypatch.setattr(_futures, "_look_for", lambda task: (looks.append(task), real(task)))
    monkeypatch.setattr(_futures, "_WATCH_PAUSE", 600.0)
    monkeypatch.setattr(_futures, "_watch_again", 0.0)
    with pymizu.PoolExecutor(2) as ex:
        fs = [ex.submit(tasks.sleep, 2) for _ in range(30)]
        try:
            done, not_done = cf.wait(fs, timeout=0.01)
            assert not done and len(not_done) == 30
            assert len(looks) == 1
        finally:
            ex.shutdown(cancel_futures=True)


# Whether a CPU is left for a caller beside one busy worker: callers watch for outcomes
# (poll without sleeping) only then.
SPARE_CPU = (os.cpu_count() or 1) >= 2


def test_a_caller_with_a_cpu_free_watches_a_short_task_instead_of_sleeping():
    with pymizu.Pool(1) as p:
        assert p.submit(tasks.add, 1, 1).result(timeout=60) == 2
        before = p.status()["waits"]
        # A caller watches only while a CPU is free, which another process may deny it for a
        # while: rounds go on until five were watched (or 500 rounds).
        rounds = 0
        while True:
            assert p.submit(tasks.spin, 0.001).result(timeout=60) == 0.001
            rounds += 1
            watched = p.status()["waits"]["watched"] - before["watched"]
            if rounds >= 10 and (not SPARE_CPU or watched >= 5 or rounds >= 500):
                break
        after = p.status()["waits"]
    watched = after["watched"] - before["watched"]
    if SPARE_CPU:
        # A watch lasts 5 ms: only a machine stalled for longer than that makes one sleep.
        assert watched >= 5
    else:
        assert watched == 0 and after["parks"] > before["parks"]


def test_a_caller_sleeps_while_every_cpu_runs_a_worker():
    n = os.cpu_count() or 1
    with pymizu.Pool(n) as p:
        assert p.submit(tasks.add, 1, 1).result(timeout=60) == 2
        before = p.status()["waits"]
        first = p.submit(tasks.spin, 0.1)
        rest = [p.submit(tasks.spin, 1.0) for _ in range(n - 1)]
        deadline = time.monotonic() + 60
        while sum(w["busy"] for w in p.status()["workers"]) < n:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert first.result(timeout=60) == 0.1
        after = p.status()["waits"]
        assert [t.result(timeout=60) for t in rest] == [1.0] * (n - 1)
    assert after["watched"] == before["watched"]
    assert after["parks"] > before["parks"]


def test_an_event_loop_looks_for_short_outcomes_itself(monkeypatch):
    from pymizu import _loops

    handovers = []
    real = _loops._Watcher.watch
    monkeypatch.setattr(_loops._Watcher, "watch", lambda self, *a: (handovers.append(a), real(self, *a)))
    with pymizu.Pool(1) as p, pymizu.PoolExecutor(1) as ex:
        ran_in = []
        # Rounds in which the loop settled every outcome itself. The loop watches only while
        # a CPU is free, which another process may deny it for a while: rounds go on until
        # five were settled so (or 500 rounds), each checking its three outcomes.
        settled = []

        async def main():
            loop = asyncio.get_running_loop()
            got = []
            while len(got) < 30 or (SPARE_CPU and len(settled) < 5 and len(got) < 1500):
                before = len(handovers)
                got.append(await p.submit(tasks.spin, 0.002))
                got.append(await loop.run_in_executor(ex, tasks.spin, 0.002))
                f = ex.submit(tasks.spin, 0.002)
                f.add_done_callback(lambda _f: ran_in.append(threading.current_thread().name))
                got.append(await asyncio.wrap_future(f))
                if len(handovers) == before and ran_in[-1] == "MainThread":
                    settled.append(len(got) // 3)
            return got

        got = asyncio.run(main())
        assert got == [0.002] * len(got)
    assert len(ran_in) == len(got) // 3
    if SPARE_CPU:
        # Settled by the loop itself, not handed to a thread that sleeps until the worker
        # wakes it (only a machine stalled for longer than a watch hands one over).
        assert len(settled) >= 5
    else:
        assert len(handovers) == 10 and ran_in == ["pymizu-collector"] * 10


def test_a_loop_closed_while_it_watched_hands_its_futures_on():
    with pymizu.PoolExecutor(1) as ex:
        ran = threading.Event()

        async def first():
            f = ex.submit(tasks.spin, 0.005)
            f.add_done_callback(lambda _f: ran.set())
            return f

        f = asyncio.run(first())
        # The task finishes and the closed loop's watch runs out meanwhile: the next loop may
        # watch, and a short task of its own ends that watch before it runs out.
        time.sleep(0.05)

        async def second():
            return await asyncio.wrap_future(ex.submit(tasks.spin, 0.002))

        assert asyncio.run(second()) == 0.002
        assert ran.wait(60)
        assert f.result(timeout=60) == 0.005


class _CountingLoop(asyncio.SelectorEventLoop):
    """An event loop counting the writes that wake it from another thread
    (`call_soon_threadsafe`)."""

    def __init__(self):
        super().__init__()
        self.wakeup_writes = 0

    def _write_to_self(self):
        self.wakeup_writes += 1
        super()._write_to_self()


def test_an_outcome_the_loop_finds_itself_reaches_asyncio_without_a_wakeup_write():
    # `wrap_future` and `run_in_executor` hand the outcome to the loop with
    # `call_soon_threadsafe`; when the loop's own watch settles the future, the loop is awake,
    # the outcome goes straight into the asyncio future and needs no wake-up (a system call
    # to write, another to read it back).
    # The loop watches only while a CPU is free, which another process may deny it for a
    # while: rounds go on until ten outcomes came without a write (or 500 rounds).
    with pymizu.PoolExecutor(1) as ex:

        async def main():
            loop = asyncio.get_running_loop()
            got = []
            quiet = 0
            while len(got) < 20 or (SPARE_CPU and quiet < 10 and len(got) < 1000):
                for make in (lambda: loop.run_in_executor(ex, tasks.spin, 0.002),
                             lambda: asyncio.wrap_future(ex.submit(tasks.spin, 0.002))):
                    before = loop.wakeup_writes
                    got.append(await make())
                    quiet += loop.wakeup_writes == before
            return got, loop, quiet

        with asyncio.Runner(loop_factory=_CountingLoop) as runner:
            got, loop, quiet = runner.run(main())
            assert got == [0.002] * len(got)
            writes = loop.wakeup_writes
    if SPARE_CPU:
        # (Only a machine stalled for longer than a watch hands an outcome over to a thread,
        # which must wake the loop.)
        assert quiet >= 10
    else:
        assert len(got) == 20 and writes >= 20


def test_wrap_future_of_a_finished_future_in_its_loop_needs_no_wakeup_write():
    # `wrap_future` of a future that is already finished (a short task's, most of the time)
    # hands the outcome over with `call_soon_threadsafe`; in the loop's own thread that
    # needs no wake-up write: the hand-over is queued with `call_soon`, and the coroutine
    # still gives the loop a round before it resumes.
    with pymizu.PoolExecutor(1) as ex:
        done = [ex.submit(tasks.add, i, 1) for i in range(10)]
        failed = ex.submit(tasks.boom, "late")
        assert [f.result(timeout=60) for f in done] == list(range(1, 11))
        assert isinstance(failed.exception(timeout=60), ValueError)

        async def main():
            loop = asyncio.get_running_loop()
            rounds = 0

            async def other():
                nonlocal rounds
                while True:
                    rounds += 1
                    await asyncio.sleep(0)

            ticker = asyncio.ensure_future(other())
            await asyncio.sleep(0)
            got = []
            for f in done:
                before = rounds
                got.append(await asyncio.wrap_future(f))
                assert rounds > before  # the loop ran another task meanwhile
            with pytest.raises(ValueError, match="late"):
                await asyncio.wrap_future(failed)
            seen = []
            done[0].add_done_callback(lambda f: seen.append(f.result()))  # any other callback
            ticker.cancel()
            return got, seen, loop

        with asyncio.Runner(loop_factory=_CountingLoop) as runner:
            got, seen, loop = runner.run(main())
            writes = loop.wakeup_writes
    assert got == list(range(1, 11))
    assert seen == [1]  # run at once, in this thread, as always
    assert writes == 0


def test_the_loop_that_settles_a_future_hands_its_outcome_to_wrap_future_at_once():
    # `wrap_future` copies a finished future's outcome into the asyncio future in a handle
    # of the loop; when the loop itself settles the future, that copy happens at once (the
    # coroutine resumes a loop round sooner): a done-callback added after `wrap_future`'s
    # finds the asyncio future done — with the task's value or its exception. (When another
    # thread settles it — the collector, once a busy machine kept the loop from looking — the
    # hand-over goes through a handle, which the loop may or may not have run by the time
    # that thread reaches the next callback; and a callback added to a future settled that
    # way runs at once, before the handle: neither says anything about the loop's settling.)
    # The loop watches only while a CPU is free, which another process may deny it for a
    # while: rounds go on until the loop settled ten (or 500 rounds), each checked.
    def by_loop(seen):
        return [done for name, done, adding in seen if name == "MainThread" and not adding]

    with pymizu.PoolExecutor(1) as ex:

        async def main():
            seen = []
            i = 0
            while i < 20 or (SPARE_CPU and len(by_loop(seen)) < 10 and i < 500):
                fails = i % 2 == 1
                i += 1
                f = ex.submit(tasks.spin_then_fail, 0.002, "no") if fails else ex.submit(tasks.spin, 0.002)
                af = asyncio.wrap_future(f)
                adding = [True]
                f.add_done_callback(
                    lambda _f, af=af, adding=adding: seen.append(
                        (threading.current_thread().name, af.done(), adding[0])
                    )
                )
                adding[0] = False
                if fails:
                    with pytest.raises(ValueError, match="no") as caught:
                        await af
                    # The same exception the future holds, its remote traceback kept.
                    assert caught.value is f.exception()
                    assert "spin_then_fail" in str(caught.value.__cause__)
                else:
                    assert await af == 0.002
            return seen

        seen = asyncio.run(main())
    assert len(seen) >= 20
    assert all(by_loop(seen)), seen
    if SPARE_CPU:
        assert len(by_loop(seen)) >= 10, seen


def test_a_done_callback_raising_while_the_loop_settles_is_logged_and_the_rest_run(caplog):
    # Whoever settles the future (the loop's own watch while a CPU is free, else the
    # collector thread) runs its callbacks in order, as `concurrent.futures` does: one that
    # raises is logged, those after it still run and `wrap_future` gets its outcome. (Settled
    # by the collector thread, the coroutine may resume before the last callback has run, as
    # with `ProcessPoolExecutor`: the order is checked per future. Shutting the executor down
    # waits for the collector, so every callback has run after the `with`.)
    def bad(_f):
        raise ZeroDivisionError("in a callback")

    order = []
    with pymizu.PoolExecutor(1) as ex, caplog.at_level("ERROR", logger="concurrent.futures"):

        async def main():
            for i in range(5):
                f = ex.submit(tasks.spin, 0.002)
                f.add_done_callback(lambda _f, i=i: order.append(("first", i)))
                af = asyncio.wrap_future(f)
                f.add_done_callback(bad)
                f.add_done_callback(lambda _f, i=i: order.append(("last", i)))
                assert await af == 0.002

        asyncio.run(main())
    assert sorted(order) == sorted([("first", i) for i in range(5)] + [("last", i) for i in range(5)])
    assert all(order.index(("first", i)) < order.index(("last", i)) for i in range(5))
    logged = [r for r in caplog.records if r.name == "concurrent.futures"]
    assert len(logged) == 5
    assert all("exception calling callback" in r.getMessage() for r in logged)
    assert all(r.exc_info[0] is ZeroDivisionError for r in logged)


def test_a_handle_another_thread_adds_while_the_loop_settles_a_future_still_runs():
    # While the loop's watch runs done-callbacks, another thread's `call_soon_threadsafe`
    # must still wake it (or find it awake) and run that handle. The loop watches only while
    # a CPU is free, which another process may deny it for a while: rounds go on until five
    # of them settled their future in the loop's thread (every round checks its handle ran).
    with pymizu.PoolExecutor(1) as ex:

        async def main():
            loop = asyncio.get_running_loop()
            names = []
            while len(names) < 10 or (SPARE_CPU and names.count("MainThread") < 5 and len(names) < 500):
                from_thread = loop.create_future()

                def hand_over(_f, from_thread=from_thread):
                    t = threading.Thread(
                        target=loop.call_soon_threadsafe, args=(from_thread.set_result, 1)
                    )
                    t.start()
                    t.join()
                    names.append(threading.current_thread().name)

                f = ex.submit(tasks.spin, 0.002)
                f.add_done_callback(hand_over)
                assert await asyncio.wrap_future(f) == 0.002
                # Nothing else would wake the loop: a lost handle fails here, not by hanging.
                assert await asyncio.wait_for(from_thread, 30) == 1
            return names

        names = asyncio.run(main())
    assert len(names) >= 10
    if SPARE_CPU:
        assert names.count("MainThread") >= 5


@pytest.mark.parametrize("how", ["imap", "PoolExecutor.map"])
def test_a_streamed_map_hands_on_a_ready_result_while_the_one_halfway_along_waits(tmp_path, how):
    # One worker runs the chunks in order. The first waits for a file a timer makes while
    # the caller waits for it; the one halfway along waits for a file made only once the
    # first result was handed on. A caller that waited for the halfway one (as `Pool.map`
    # does) would never see the first result, and the worker's hang guard would fail the map.
    first, gate = str(tmp_path / "first"), str(tmp_path / "gate")
    items = [(first, "a"), (gate, "held"), (None, "b")]
    with (pymizu.PoolExecutor(1) if how == "PoolExecutor.map" else pymizu.Pool(1)) as p:
        if how == "imap":
            it = p.imap(tasks.wait_for_file, items, chunksize=1)
        else:
            it = p.map(tasks.wait_for_file, items, chunksize=1)
        timer = threading.Timer(0.2, lambda: open(first, "w").close())
        timer.start()
        assert next(it) == "a"
        open(gate, "w").close()
        assert list(it) == ["held", "b"]
        timer.join()


def test_pool_tasks_are_waited_on_by_wait_and_as_completed_like_futures(tmp_path):
    gate = str(tmp_path / "gate")
    with pymizu.Pool(2) as p, cf.ThreadPoolExecutor(1) as threads:
        # Finished, failed, and held behind a gate; also mixed with a thread pool's future.
        quick = p.submit(tasks.add, 1, 2)
        failed = p.submit(tasks.fail_odd, 1)
        held = p.submit(tasks.wait_for, gate)
        other = threads.submit(pow, 2, 10)
        assert quick.result(timeout=60) == 3
        assert isinstance(failed.exception(timeout=60), ValueError) and other.result(60) == 1024
        done, not_done = cf.wait([quick, failed, held, other], timeout=0.2)
        assert done == {quick, failed, other} and not_done == {held}
        done, _ = cf.wait([held, failed], return_when=cf.FIRST_EXCEPTION, timeout=60)
        assert done == {failed}
        done, _ = cf.wait([held, quick], return_when=cf.FIRST_COMPLETED, timeout=60)
        assert done == {quick}
        with pytest.raises(cf.TimeoutError):
            list(cf.as_completed([held], timeout=0.1))
        seen = []
        for t in cf.as_completed([held, quick, other, failed], timeout=60):
            seen.append(t)
            assert t.done()
            if len(seen) == 3:
                open(gate, "w").close()
        assert set(seen) == {held, quick, other, failed} and len(seen) == 4
        assert held.result(timeout=0) is True
        # With an executor's futures in the same call: one waiter over both kinds.
        gate2 = str(tmp_path / "gate2")
        with pymizu.PoolExecutor(1) as ex:
            fut = ex.submit(tasks.wait_for, gate2)
            task = p.submit(tasks.add, 2, 2)
            done, _ = cf.wait([fut, task], return_when=cf.FIRST_COMPLETED, timeout=60)
            assert done == {task}
            open(gate2, "w").close()
            third = p.submit(tasks.add, 3, 3)
            got = list(cf.as_completed([fut, task, third], timeout=60))
            assert len(got) == 3 and set(got) == {fut, task, third}
            assert fut.result(timeout=0) is True
        # Many at once, each reported once; tasks of a batch too.
        ts = [p.submit(tasks.fail_odd, i) for i in range(300)]
        ts += p.submit_batch(tasks.add, [(i, 1) for i in range(300)])
        got = list(cf.as_completed(ts, timeout=60))
        assert len(got) == 600 and set(got) == set(ts)
        done, not_done = cf.wait(ts, timeout=60)
        assert len(done) == 600 and not not_done
        assert sum(t.exception() is not None for t in ts) == 150


def test_pool_task_done_callbacks_run_once_finished_or_cancelled(tmp_path, caplog):
    gate = str(tmp_path / "gate")
    with pymizu.Pool(1) as p:
        ran = []
        finished = threading.Event()
        t = p.submit(tasks.wait_for, gate)
        t.add_done_callback(
            lambda task: (ran.append((task.result(), threading.current_thread().name)), finished.set())
        )
        queued = p.submit(tasks.add, 1, 1)  # behind `t` on the only worker
        queued.add_done_callback(lambda task: ran.append(("cancelled", task.cancelled())))
        assert ran == []
        # Cancelling runs the callbacks at once, in the cancelling thread (as a future does).
        assert queued.cancel()
        assert ran == [("cancelled", True)]
        open(gate, "w").close()
        assert finished.wait(60)
        assert ran[1] == (True, "pymizu-await")
        # A callback added to a finished task runs at once; one that raises is logged.
        t.add_done_callback(lambda task: ran.append("at once"))
        assert ran[-1] == "at once"
        with caplog.at_level("ERROR", logger="concurrent.futures"):
            t.add_done_callback(lambda task: 1 / 0)
        assert "ZeroDivisionError" in caplog.text


@pytest.mark.parametrize("kind", ["Pool", "PoolExecutor"])
@pytest.mark.parametrize("how", ["result", "wait"])
def test_a_queued_task_another_thread_waits_on_can_be_cancelled(tmp_path, kind, how):
    # The waiting thread holds the task's handle; the cancel goes through the pool by id, and
    # the waiter sees the cancellation, as a standard future's waiter does.
    gate = str(tmp_path / "gate")
    with (pymizu.Pool(1) if kind == "Pool" else pymizu.PoolExecutor(1)) as p:
        blocker = p.submit(tasks.wait_for, gate)
        queued = p.submit(tasks.add, 1, 1)
        out = []
        started = threading.Event()

        def waiter():
            started.set()
            if how == "result":
                try:
                    out.append(queued.result(timeout=60))
                except cf.CancelledError as e:
                    out.append(e)
            else:
                out.append(cf.wait([queued], timeout=60))

        th = threading.Thread(target=waiter)
        th.start()
        started.wait(60)
        time.sleep(0.05)  # (whether or not it is parked yet, the cancel must hold)
        assert queued.cancel() and queued.cancelled() and queued.done()
        th.join(60)
        assert not th.is_alive()
        if how == "result":
            assert isinstance(out[0], cf.CancelledError)
        else:
            assert out[0].done == {queued}
        open(gate, "w").close()
        assert blocker.result(timeout=60) is True
        # The slot of the cancelled task serves again.
        assert p.submit(tasks.add, 2, 2).result(timeout=60) == 4
