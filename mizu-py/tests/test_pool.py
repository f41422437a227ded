"""pymizu.Pool and Task: submit, batches, collects, maps, seeds, nesting, asyncio, start-up
options, worker death, Ctrl-C — all with real worker processes."""

import asyncio
import functools
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest

import pymizu
import tasks


@pytest.fixture(scope="module")
def pool():
    with pymizu.Pool(2) as p:
        yield p


def philox(seed, i):
    return np.random.Generator(np.random.Philox(key=seed, counter=i << 128))


def test_submit_result_and_task_state(pool):
    t = pool.submit(tasks.add, 2, 40)
    assert t.result(timeout=60) == 42
    assert t.done() and not t.cancelled()
    assert "finished" in repr(t)


def test_a_task_says_what_it_is_doing():
    # Its repr follows the task (what `done()` and `running()` say), also before anything
    # collected its outcome.
    import multiprocessing as mp

    ev = mp.get_context("spawn").Event()
    with pymizu.Pool(1) as p:
        busy = p.submit(tasks.wait_event, ev)
        deadline = time.monotonic() + 60
        while not busy.running():
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.001)
        assert repr(busy) == "<pymizu.Task running>"
        queued = p.submit(tasks.add, 1, 1)
        failing = p.submit(tasks.boom, "x")
        dropped = p.submit(tasks.add, 2, 2)
        assert repr(queued) == "<pymizu.Task pending>"
        assert dropped.cancel() and repr(dropped) == "<pymizu.Task cancelled>"
        ev.set()
        p.collect_all([busy])
        while not (queued.done() and failing.done()):
            assert time.monotonic() < deadline, "the tasks never finished"
            time.sleep(0.001)
        # Finished, nothing read yet.
        assert repr(queued) == "<pymizu.Task finished>"
        assert repr(failing) == "<pymizu.Task failed>"
        assert queued.result(timeout=60) == 2 and repr(queued) == "<pymizu.Task finished>"


def test_a_task_exception_is_raised_as_itself_with_the_remote_traceback(pool):
    t = pool.submit(tasks.boom, "bad")
    with pytest.raises(ValueError, match="bad") as info:
        t.result(timeout=60)
    assert isinstance(info.value.__cause__, pymizu.RemoteTraceback)
    assert "boom" in str(info.value.__cause__)
    assert isinstance(t.exception(), ValueError)


def test_result_timeout_raises_timeout_error_and_the_task_stays_collectable(pool):
    t = pool.submit(tasks.sleep, 0.5)
    with pytest.raises(TimeoutError):
        t.result(timeout=0.01)
    assert t.result(timeout=60) == 0.5


def test_submit_batch_collect_all_and_collect_any(pool):
    ts = pool.submit_batch(tasks.add, [(i, i) for i in range(300)])
    assert pool.collect_all(ts, timeout=60) == [2 * i for i in range(300)]
    slow, fast = pool.submit(tasks.sleep, 1.0), pool.submit(tasks.add, 1, 1)
    assert pool.collect_any([slow, fast], timeout=60) is fast
    assert slow.result(timeout=60) == 1.0
    with pytest.raises(TimeoutError):
        pool.collect_any([pool.submit(tasks.sleep, 0.5)], timeout=0.01)


def test_cancel_a_queued_task(pool):
    blockers = [pool.submit(tasks.sleep, 0.5) for _ in range(2)]
    queued = pool.submit(tasks.add, 1, 1)
    assert queued.cancel()
    assert queued.cancelled()
    with pytest.raises(pymizu.CancelledError):
        queued.result(timeout=60)
    assert [b.result(timeout=60) for b in blockers] == [0.5, 0.5]


def test_map_starmap_imap_keep_order_for_any_chunksize(pool):
    want = [2 * i for i in range(1000)]
    assert pool.map(tasks.add, range(1000), range(1000)) == want
    assert pool.map(tasks.add, range(1000), range(1000), chunksize=1) == want
    assert pool.map(tasks.add, range(1000), range(1000), chunksize=999) == want
    assert pool.starmap(tasks.add, [(i, i) for i in range(1000)], chunksize=7) == want
    ran = pool.status()["tasks"]
    it = pool.imap(tasks.add, range(1000), range(1000), chunksize=10)
    deadline = time.monotonic() + 60
    while pool.status()["tasks"] < ran + 100:  # all 100 chunks run before anyone iterates
        assert time.monotonic() < deadline, "hang guard: imap submits at the call"
        time.sleep(0.01)
    assert next(it) == 0
    assert list(it) == want[1:]
    assert pool.map(tasks.add, [], []) == []


def test_maps_of_several_iterables_pair_their_elements_as_zip_does(pool):
    import itertools

    # Sized iterables travel as columns, the others as argument tuples: the calls are the
    # same, cut to the shortest iterable. (Each case makes fresh iterables for each map.)
    cases = [
        lambda: (range(300), range(1000)),
        lambda: (range(300), itertools.repeat(5)),
        lambda: (list("abcdef"), np.arange(6.0), {"k": 1, "l": 2, "m": 3}),
        lambda: (iter(range(50)), range(40), (x for x in range(45))),
        lambda: ([], range(3)),
    ]
    for make in cases:
        fn = tasks.add if len(make()) == 2 else tasks.triple
        want = [fn(*a) for a in zip(*make())]
        assert pool.map(fn, *make(), chunksize=7) == want
        assert list(pool.imap(fn, *make())) == want
        assert sorted(pool.imap_unordered(fn, *make()), key=repr) == sorted(want, key=repr)
    assert pool.map(tasks.add, range(10), itertools.count(100)) == [i + 100 + i for i in range(10)]
    # A failing call of a map of columns is reported with its position, seeded or not.
    for seed in (None, 7):
        with pytest.raises(ValueError) as info:
            pool.map(tasks.triple, ["ok"] * 30 + ["bad"] * 3, range(33), range(33), seed=seed, chunksize=4)
        assert info.value._pymizu_index == 30 and info.value.args == (30,)
    # A seeded map of columns draws the same as one of tuples.
    assert pool.map(tasks.rng_draws, range(20), [2] * 20, seed=3) == pool.starmap(
        tasks.rng_draws, [(i, 2) for i in range(20)], seed=3
    )


def test_imap_unordered_yields_each_chunk_as_it_finishes(pool):
    want = [2 * i for i in range(1000)]
    assert sorted(pool.imap_unordered(tasks.add, range(1000), range(1000))) == want
    assert sorted(pool.imap_unordered(tasks.add, range(1000), range(1000), chunksize=7)) == want
    # A first chunk that cannot finish yet does not hold back the ones after it: it waits
    # for a file made only once the others were yielded.
    gate = os.path.join(tempfile.mkdtemp(), "gate")
    it = pool.imap_unordered(tasks.wait_for_file, [(gate, "held"), (None, "a"), (None, "b")], chunksize=1)
    assert sorted([next(it), next(it)]) == ["a", "b"]
    open(gate, "w").close()
    assert list(it) == ["held"]
    with pytest.raises(KeyError):
        list(pool.imap_unordered(tasks.fails_at, range(50), [7] * 50, chunksize=5))
    with pytest.raises(TimeoutError):
        list(pool.imap_unordered(tasks.sleep, [0.3] * 4, timeout=0.05, chunksize=1))
    assert list(pool.imap_unordered(tasks.ident, [])) == []
    assert pool.map(tasks.ident, range(5)) == list(range(5)), "the pool goes on"


def test_default_chunks_come_in_equal_rounds_and_cover_the_map(pool):
    plan = pymizu._native.chunk_plan(8000, 2)
    assert plan[:4] == [(0, 125), (125, 125), (250, 969), (1219, 969)]
    assert sum(k for _, k in plan) == 8000
    assert [s for s, _ in plan] == [sum(k for _, k in plan[:i]) for i in range(len(plan))]
    assert pymizu._native.chunk_plan(10, 3, 4) == [(0, 4), (4, 4), (8, 2)]


def test_map_raises_the_first_failing_element_with_its_index(pool):
    with pytest.raises(KeyError) as info:
        pool.map(tasks.fails_at, range(500), [137] * 500, chunksize=10)
    assert info.value._pymizu_index == 137
    assert pool.map(tasks.add, range(3), range(3)) == [0, 2, 4], "the pool goes on"


def test_map_over_one_iterable_raises_with_the_index_and_never_stops_short(pool):
    # One iterable's elements are called as `fn(x)` by a native loop in the worker.
    with pytest.raises(KeyError) as info:
        pool.map(functools.partial(tasks.fails_at, bad=137), range(500), chunksize=10)
    assert info.value._pymizu_index == 137
    # StopIteration from an element fails the map (a loop that took it for the end of the
    # chunk would return fewer results).
    with pytest.raises((StopIteration, RuntimeError)) as info:
        pool.map(functools.partial(tasks.stop_at, bad=7), range(20), chunksize=20)
    stop = info.value if isinstance(info.value, StopIteration) else info.value.__cause__
    assert type(stop) is StopIteration and stop.args == (7,) and stop._pymizu_index == 7
    assert pool.map(tasks.ident, range(5)) == list(range(5)), "the pool goes on"


def test_map_timeout(pool):
    with pytest.raises(TimeoutError):
        pool.map(tasks.sleep, [0.3] * 8, timeout=0.05, chunksize=1)


def test_bad_map_arguments_are_clear_errors(pool):
    with pytest.raises(ValueError, match="chunksize"):
        pool.map(tasks.ident, [1], chunksize=0)
    with pytest.raises(ValueError, match="seed"):
        pool.map(tasks.ident, [1], seed=-1)
    with pytest.raises(ValueError, match="seed"):
        pool.map(tasks.ident, [1], seed=2**64)
    with pytest.raises(TypeError, match="unexpected"):
        pool.imap(tasks.ident, [1], chunk=3)


def test_seeded_maps_match_numpy_philox_and_do_not_depend_on_workers_or_chunks(pool):
    n = 64
    got = pool.map(tasks.rng_draws, range(n), seed=12345, chunksize=5)
    for i, (draws, _) in enumerate(got):
        assert draws == philox(12345, i).random(3).tolist()
    assert pool.map(tasks.rng_draws, range(n), seed=12345, chunksize=1) == got
    with pymizu.Pool(1) as one:
        assert one.map(tasks.rng_draws, range(n), seed=12345) == got
    # A split map continues the streams with `offset`.
    tail = pool.map(tasks.rng_draws, range(n - 10), seed=12345, offset=10)
    assert tail == got[10:]
    # stdlib random is seeded per element from the same stream.
    assert got[0][1] != got[1][1]
    assert pool.map(tasks.rng_draws, range(4), seed=1) != pool.map(tasks.rng_draws, range(4), seed=2)


def test_current_rng_outside_a_seeded_element_is_an_error(pool):
    with pytest.raises(pymizu.MizuError, match="seed"):
        pymizu.current_rng()
    with pytest.raises(pymizu.MizuError, match="seed"):
        pool.submit(tasks.rng_draws, 0).result(timeout=60)


def test_nested_maps_with_current_pool_never_deadlock():
    with pymizu.Pool(1) as one:  # the only worker must help while it waits
        assert one.submit(tasks.nested_sum, 100).result(timeout=120) == sum(2 * i for i in range(100))
        assert one.submit(tasks.nested_deep, 3).result(timeout=120) == 8
        # Waiting for any of them runs them too; and more in flight than a worker's own task
        # slots (256) wait for room by running them.
        assert one.submit(tasks.nested_first, 3).result(timeout=120) in (1, 2, 3)
        assert one.submit(tasks.nested_all_in_flight, 1000).result(timeout=120) == sum(range(1, 1001))
        # A search's cancelled leftovers do not clog the worker's queues: rounds of 100 nested
        # tasks, all but a few cancelled while queued (the worker runs them only while the
        # round's collect_any waits), then more submissions.
        cancelled, total = one.submit(tasks.nested_search, 20).result(timeout=120)
        assert cancelled > 20 * 90 and total == sum(range(1, 41))
        seeded = one.submit(tasks.nested_seeded, 5).result(timeout=120)
        assert [d for d, _ in seeded] == [philox(7, i).random(3).tolist() for i in range(5)]
    with pytest.raises(pymizu.MizuError, match="inside"):
        pymizu.current_pool()


def test_await_tasks_in_asyncio(pool):
    async def main():
        ts = [pool.submit(tasks.add, i, 1) for i in range(50)]
        slow = pool.submit(tasks.sleep, 0.2)
        first = await asyncio.gather(*ts)
        return first, await slow

    first, slow = asyncio.run(main())
    assert first == [i + 1 for i in range(50)]
    assert slow == 0.2

    async def failing():
        await pool.submit(tasks.boom, "async")

    with pytest.raises(ValueError, match="async"):
        asyncio.run(failing())


def test_the_await_watcher_thread_ends_when_nothing_is_awaited():
    import threading

    from pymizu import _loops

    with pymizu.Pool(1) as p:

        async def main():
            return await p.submit(tasks.add, 1, 2)

        async def slow():
            return await p.submit(tasks.sleep, 0.3)

        assert asyncio.run(main()) == 3
        assert asyncio.run(slow()) == 0.3
        watcher = _loops._watcher._thread
        assert watcher.is_alive()
    watcher.join(timeout=60)
    assert not watcher.is_alive()
    assert not any(t.name == "pymizu-await" and t is watcher for t in threading.enumerate())


def test_submitting_from_many_threads(pool):
    from concurrent.futures import ThreadPoolExecutor

    def work(k):
        return [pool.submit(tasks.add, k, i).result(timeout=60) for i in range(200)]

    with ThreadPoolExecutor(4) as tp:
        got = list(tp.map(work, range(4)))
    assert got == [[k + i for i in range(200)] for k in range(4)]


def test_initializer_runs_in_every_worker_before_tasks():
    with pymizu.Pool(2, initializer=tasks.remember, initargs=("who", "init")) as p:
        assert set(p.map(tasks.recall, ["who"] * 20, chunksize=1)) == {"init"}


def test_a_failing_initializer_fails_tasks_as_broken_process_pool():
    from concurrent.futures.process import BrokenProcessPool

    with pymizu.Pool(1, initializer=tasks.init_fail) as p:
        with pytest.raises(pymizu.InitializerError, match="initializer refuses") as info:
            p.submit(tasks.add, 1, 1).result(timeout=60)
        assert isinstance(info.value, BrokenProcessPool)
        # Every later task fails the same way, its remote traceback no longer than the first's
        # (not the frames of every failure before it).
        first = str(info.value.__cause__)
        for _ in range(20):
            e = p.submit(tasks.add, 1, 1).exception(timeout=60)
            assert isinstance(e, pymizu.InitializerError)
            assert str(e.__cause__) == first


def test_max_tasks_per_child_replaces_workers():
    with pymizu.Pool(1, max_tasks_per_child=3) as p:
        pids = [p.submit(tasks.add_pid, i).result(timeout=60) for i in range(9)]
    assert [x for x, _ in pids] == list(range(9))
    by_pid = {}
    for _, pid in pids:
        by_pid[pid] = by_pid.get(pid, 0) + 1
    assert len(by_pid) == 3 and set(by_pid.values()) == {3}


@pytest.mark.parametrize("how", ["kill", "segv"])
def test_a_killed_worker_fails_its_task_and_is_replaced(how):
    with pymizu.Pool(2) as p:
        if how == "kill":
            t = p.submit(tasks.sleep, 30)
            deadline = time.monotonic() + 60
            while not any(w["busy"] for w in p.status()["workers"]):
                assert time.monotonic() < deadline, "hang guard"
                time.sleep(0.01)
            victim = next(w["pid"] for w in p.status()["workers"] if w["busy"])
            os.kill(victim, signal.SIGKILL)
        else:
            t = p.submit(tasks.segv)
        with pytest.raises(pymizu.WorkerDiedError) as info:
            t.result(timeout=60)
        from concurrent.futures.process import BrokenProcessPool

        assert isinstance(info.value, BrokenProcessPool)
        assert p.map(tasks.add, range(100), range(100)) == [2 * i for i in range(100)]


def test_exec_timeout_fails_the_task_and_the_pool_goes_on():
    with pymizu.Pool(1, exec_timeout=0.3) as p:
        with pytest.raises(pymizu.ExecTimeoutError):
            p.submit(tasks.sleep, 30).result(timeout=60)
        assert p.submit(tasks.add, 2, 2).result(timeout=60) == 4


def test_stop_fails_queued_work_and_later_submits(pool):
    p = pymizu.Pool(1)
    running = p.submit(tasks.sleep, 0.3)
    queued = [p.submit(tasks.add, 1, i) for i in range(5)]
    p.stop(grace=5)
    for t in [running, *queued]:
        with pytest.raises((pymizu.StoppedError, pymizu.CancelledError, pymizu.WorkerDiedError)):
            r = t.result(timeout=60)
            if t is running and r == 0.3:
                raise pymizu.StoppedError("finished before the stop")
    with pytest.raises(pymizu.StoppedError):
        p.submit(tasks.add, 1, 1)
    p.stop()  # idempotent


def test_bad_pool_arguments():
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="workers"):
            pymizu.Pool(bad)
    with pytest.raises(ValueError, match="max_tasks_per_child"):
        pymizu.Pool(1, max_tasks_per_child=0)
    for bad in (0, -1, 10**12, 2**20 + 1, 2.5, "9"):
        with pytest.raises(ValueError, match=r"slots must be an int in 1\.\.=1048576"):
            pymizu.Pool(1, slots=bad)
    with pytest.raises(ValueError, match="workers must be 1..=1024"):
        pymizu.Pool(1025)
    with pymizu.Pool(1, slots=np.int64(8)) as p:  # any integer
        assert p.submit(tasks.add, 1, 1).result(timeout=60) == 2
    with pytest.raises(TypeError, match="initializer"):
        pymizu.Pool(1, initializer=5)


def test_functions_of_the_callers_script_run_in_workers(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import pymizu

        def square(x):
            return x * x

        if __name__ == "__main__":
            with pymizu.Pool(2) as p:
                print(sum(p.map(square, range(100))))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(sum(i * i for i in range(100)))


def test_a_worker_starts_without_what_only_a_caller_uses(tmp_path):
    # `import pymizu` imports what a name needs when it is first used: a worker (which imports
    # the package, then the caller's script) starts without asyncio, concurrent.futures,
    # multiprocessing or logging — most of its start-up time otherwise — and imports them when
    # a task needs them, with the caller's multiprocessing authkey.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import sys
        import pymizu

        HEAVY = ("asyncio", "concurrent.futures", "multiprocessing", "logging")

        def loaded():
            return [m for m in HEAVY if m in sys.modules]

        def authkey():
            import multiprocessing
            return bytes(multiprocessing.current_process().authkey)

        if __name__ == "__main__":
            print(loaded())
            with pymizu.Pool(1) as p:
                print(p.submit(loaded).result())
                key = p.submit(authkey).result()
                import multiprocessing
                print(key == bytes(multiprocessing.current_process().authkey))
            with pymizu.PoolExecutor(1) as ex:
                print(ex.submit(loaded).result())
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["[]", "[]", "True", "[]"], out.stdout


def test_looking_for_an_integration_imports_nothing_until_it_is_imported():
    # `hasattr(pymizu, "joblib")` (a tool walking modules does as much) neither imports joblib
    # nor raises when it is missing; `import pymizu.joblib` makes the attribute.
    code = textwrap.dedent("""
        import sys
        import pymizu

        print(hasattr(pymizu, "joblib"), hasattr(pymizu, "dask"), "joblib" in sys.modules)
        print(hasattr(pymizu, "Pool"), hasattr(pymizu, "_native"))
        import pymizu.joblib
        print(hasattr(pymizu, "joblib"), pymizu.joblib.__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == [
        "False False False",
        "True True",
        "True pymizu.joblib",
    ], out.stdout


def in_forked_child(run) -> bytes:
    """What `run()` returns (bytes) in a child made by `os.fork()`, or the repr of what it
    raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            msg = run()
        except BaseException as e:
            msg = repr(e).encode()[:200]
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    got = os.read(r, 300)
    os.waitpid(pid, 0)
    return got


def test_a_pool_used_in_a_forked_child_raises_a_clear_error(pool):
    def run():
        try:
            pool.submit(tasks.add, 1, 1)
            return b"no error"
        except pymizu.ForkedError as e:
            return b"ForkedError " + str(e).encode()[:100]

    got = in_forked_child(run)
    assert got.startswith(b"ForkedError"), got
    assert pool.submit(tasks.add, 1, 1).result(timeout=60) == 2, "the parent's pool is intact"


def test_a_forked_child_makes_uses_and_stops_pools_of_its_own(pool):
    def run():
        with pymizu.Pool(1) as own:
            got = own.submit(tasks.add, 2, 2).result(timeout=60)
        with pymizu.PoolExecutor(1) as ex:
            got2 = ex.submit(tasks.add, 3, 3).result(timeout=60)
        try:
            pool.stop()
            refused = False
        except pymizu.ForkedError:
            refused = True
        return f"ok {got} {got2} {refused}".encode()

    got = in_forked_child(run)
    assert got == b"ok 4 6 True", got
    assert pool.submit(tasks.add, 1, 1).result(timeout=60) == 2, "the parent's pool is intact"


# For scripts that must be interrupted inside a given function (not before it is called): a
# thread that prints `text` once the main thread runs `name` and `ready()` holds, which it can
# only see while the main thread has let go of the GIL (the waits do), so a signal sent then
# lands inside the call.
_SAY_WHEN_INSIDE = """
def say_when_inside(name, text, ready=lambda: True):
    import sys, threading, time
    main = threading.main_thread().ident
    # The function of this script (threading has methods named `wait` too).
    here = sys._getframe().f_code.co_filename
    def watch():
        while True:
            f = sys._current_frames().get(main)
            while f is not None and (f.f_code.co_name, f.f_code.co_filename) != (name, here):
                f = f.f_back
            if f is not None and ready():
                print(text, flush=True)
                return
            time.sleep(0.001)
    threading.Thread(target=watch, daemon=True).start()
"""


def test_ctrl_c_interrupts_a_blocking_result(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        import pymizu, tasks
        %s
        def wait(t):
            return t.result()
        if __name__ == "__main__":
            with pymizu.Pool(1) as p:
                t = p.submit(tasks.sleep, 60)
                say_when_inside("wait", "waiting")
                try:
                    wait(t)
                except KeyboardInterrupt:
                    print("interrupted", flush=True)
    """) % (os.path.dirname(tasks.__file__), _SAY_WHEN_INSIDE))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "waiting"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "interrupted" in out
    assert proc.returncode == 0


def _run_with_lines(script):
    """Runs a Python script; its output lines arrive in a queue (`get(timeout=…)` is the hang
    guard a plain `readline()` lacks)."""
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x.strip()) for x in proc.stdout], daemon=True).start()
    return proc, lines


def test_ctrl_c_interrupts_a_submit_waiting_for_queue_space(tmp_path):
    # The worker is stuck in a task: submissions fill its queue, and so does the batch after
    # them; each wait must end at SIGINT, not when the task does (600 s: the read timeouts
    # below are hang guards). The script says when the call that must wait has begun and let
    # go of the GIL (the waits do): the queue is a ring of 256 ids (the default) whose
    # consumer has read the running task's id and gives slots back in groups of 64, so the
    # 256th submission is the first that waits.
    script = tmp_path / "fill.py"
    script.write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        import pymizu, tasks
        %s
        RING = 256
        state = {"submitted": 0, "calling": False}
        def fill_submit(p):
            for i in range(2000):
                state["submitted"] = i
                p.submit(tasks.add, i, 1)
        def fill_batch(p):
            args = [(i, 1) for i in range(2000)]
            state["calling"] = True
            p.submit_batch(tasks.add, args)
        if __name__ == "__main__":
            with pymizu.Pool(1) as p:
                t = p.submit(tasks.sleep, 600)
                while not p.status()["workers"][0]["busy"]:
                    pass
                for kind, fill, ready in (
                    ("submit", fill_submit, lambda: state["submitted"] == RING - 1),
                    ("batch", fill_batch, lambda: state["calling"]),
                ):
                    say_when_inside(fill.__name__, kind, ready)
                    try:
                        fill(p)
                        print("not interrupted", flush=True)
                    except KeyboardInterrupt:
                        print("interrupted", kind, flush=True)
                p.stop(grace=0)
            print("stopped", flush=True)
    """) % (os.path.dirname(tasks.__file__), _SAY_WHEN_INSIDE))
    proc, lines = _run_with_lines(script)
    try:
        for kind in ("submit", "batch"):
            assert lines.get(timeout=60) == kind
            proc.send_signal(signal.SIGINT)
            assert lines.get(timeout=60) == f"interrupted {kind}"
        assert lines.get(timeout=60) == "stopped"
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()


def test_ctrl_c_interrupts_a_pool_whose_workers_are_still_starting(tmp_path):
    # Workers import the caller's script; this one takes ten minutes to import there.
    script = tmp_path / "slow_import.py"
    script.write_text(textwrap.dedent("""
        import os, time
        if os.environ.get("PYMIZU_BOOTING") == "1":
            time.sleep(600)
        import pymizu
        %s
        def start():
            return pymizu.Pool(1)
        if __name__ == "__main__":
            # (Imported before the Ctrl-C: one that lands in the import machinery's own
            # clean-up callbacks is dropped by the interpreter, whatever pymizu does.)
            pymizu.Pool
            say_when_inside("start", "starting")
            try:
                start()
                print("started", flush=True)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
    """) % _SAY_WHEN_INSIDE)
    proc, lines = _run_with_lines(script)
    try:
        assert lines.get(timeout=60) == "starting"
        proc.send_signal(signal.SIGINT)
        # Well before the pool's 60 s start timeout (a hang guard, not a measurement).
        assert lines.get(timeout=30) == "interrupted"
        assert proc.wait(timeout=60) == 0
        assert [n for n in os.listdir("/dev/shm") if n.startswith(f"mizu_{proc.pid:x}_")] == []
    finally:
        proc.kill()


def test_a_worker_still_starting_leaves_when_its_owner_is_killed(tmp_path):
    # The worker would spend ten minutes importing the caller's script; kill -9 of the caller
    # meanwhile must not leave it behind (it has not joined the pool yet, so nothing watches
    # the pool for it).
    script = tmp_path / "slow_owner.py"
    script.write_text(textwrap.dedent("""
        import os, time
        if os.environ.get("PYMIZU_BOOTING") == "1":
            time.sleep(600)
        import pymizu
        if __name__ == "__main__":
            print("starting", flush=True)
            pymizu.Pool(1)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "starting"
        deadline = time.monotonic() + 60  # hang guards, far below the ten minutes
        children = []
        while not children:
            assert time.monotonic() < deadline, "no worker was started"
            time.sleep(0.05)
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                children = [int(p) for p in f.read().split()]
        # Killed at once: whether the worker is still starting its interpreter or already in
        # the slow import, it must not outlive its owner.
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        for pid in children:
            while os.path.exists(f"/proc/{pid}"):
                with open(f"/proc/{pid}/stat") as f:
                    if ") Z " in f.read():
                        break
                assert time.monotonic() < deadline, "the starting worker outlived its owner"
                time.sleep(0.05)
    finally:
        proc.kill()


def test_a_killed_caller_takes_its_busy_workers_along(tmp_path):
    # kill -9 of the process that owns the pool while its worker runs a ten-minute task: the
    # worker leaves soon after (not when the task ends) and nothing of either is left in
    # /dev/shm.
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        sys.path.insert(0, %r)
        import pymizu, tasks
        if __name__ == "__main__":
            p = pymizu.Pool(1)
            t = p.submit(tasks.sleep, 600)
            while not p.status()["workers"][0]["busy"]:
                time.sleep(0.01)
            print(p.status()["workers"][0]["pid"], flush=True)
            time.sleep(600)
    """ % os.path.dirname(tasks.__file__)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)

        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return ") Z " not in f.read()
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 60  # hang guard, far below the task's ten minutes
        while alive(worker):
            assert time.monotonic() < deadline, "the worker outlived its pool's owner"
            time.sleep(0.05)
        left = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"mizu_{p:x}_") for p in (proc.pid, worker))]
        assert left == []
    finally:
        proc.kill()


def test_a_one_worker_pool_runs_tasks_in_the_order_they_were_submitted():
    # Submitted one by one, in batches and as a map, each round while the idle worker's sleep
    # slices end: each task says how many ran before it in the worker.
    with pymizu.Pool(1) as p:
        seen = []
        for r in range(150):
            ts = [p.submit(tasks.ran_before) for _ in range(100)]
            ts += p.submit_batch(tasks.ran_before, [()] * 2000, chunksize=1)
            seen += [t.result(timeout=60) for t in ts]
            seen += p.map(tasks.ran_before, range(200), chunksize=1)
            time.sleep(0.002 + 0.0005 * (r % 5))
        assert seen == list(range(len(seen)))


def test_a_pool_a_script_keeps_till_it_exits_leaves_nothing_behind(tmp_path):
    # A pool in a script's global is never stopped by the script, and Python need not drop
    # `__main__`'s globals at exit: once a function of the script has been sent (its
    # reference is cached, and holds the script's globals), they outlive the interpreter's
    # last garbage collection. By the time the interpreter has exited the workers are gone
    # and the pool's shared memory is removed, with a task still running and others queued.
    shm = tmp_path / "shm"
    shm.mkdir()
    script = tmp_path / "keeps.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        sys.path.insert(0, %r)
        import pymizu, tasks
        def add(a, b):
            return a + b
        if __name__ == "__main__":
            p = pymizu.Pool(2)
            print(p.submit(add, 2, 3).result(timeout=60))
            print(*(w["pid"] for w in p.status()["workers"]), flush=True)
            t = p.submit(tasks.sleep, 600)
            while not any(w["busy"] for w in p.status()["workers"]):
                time.sleep(0.01)
            queued = [p.submit(tasks.sleep, 600) for _ in range(4)]
    """ % os.path.dirname(tasks.__file__)))
    env = dict(os.environ, MIZU_SHM_DIR=str(shm))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    first, pids = r.stdout.splitlines()
    assert first == "5"
    assert sorted(os.listdir(shm)) == []
    for pid in map(int, pids.split()):
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived the script"


def test_a_new_pool_removes_start_files_of_killed_owners(tmp_path):
    # A pool removes its start-up file when it stops; one whose owner was killed is removed by
    # the next pool (its pid is in the name). A live owner's file is kept.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d = tempfile.gettempdir()
    stale = os.path.join(d, f"pymizu-{dead.pid}-test.start")
    live = os.path.join(d, f"pymizu-{os.getpid()}-test.start")
    for f in (stale, live):
        with open(f, "wb"):
            pass
    try:
        with pymizu.Pool(1) as p:
            assert p.submit(tasks.add, 1, 1).result(timeout=60) == 2
        assert not os.path.exists(stale)
        assert os.path.exists(live)
    finally:
        for f in (stale, live):
            if os.path.exists(f):
                os.unlink(f)


def test_a_pool_made_outside_a_scripts_guard_gets_a_clear_error_not_a_process_storm(tmp_path):
    # Workers import a script that has a `__main__` guard; this one makes its pool outside it,
    # so each worker's import would make a pool of its own. (A script without any guard is not
    # imported by workers at all: tests/test_interactive.py.)
    script = tmp_path / "half_guarded.py"
    script.write_text(textwrap.dedent("""
        import pymizu
        def one():
            return 1
        with pymizu.Pool(1) as p:
            print(p.submit(one).result(timeout=60))
        if __name__ == "__main__":
            print("guarded part")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "__main__" in out.stderr and "InitializerError" in out.stderr


def test_more_tasks_in_flight_than_slots_never_hang():
    with pymizu.Pool(2, slots=64) as p:
        ts = [p.submit(tasks.add, i, 1) for i in range(500)]  # nobody collects meanwhile
        assert [t.result(timeout=60) for t in ts] == [i + 1 for i in range(500)]
        bs = p.submit_batch(tasks.add, [(i, 2) for i in range(500)])
        assert p.collect_all(bs, timeout=60) == [i + 2 for i in range(500)]
        assert p.map(tasks.add, range(3000), range(3000), chunksize=1) == [2 * i for i in range(3000)]


def test_bound_builtin_methods_see_their_object_as_it_is_now(pool):
    d = {"k": 1}
    assert pool.submit(d.get, "k").result(timeout=60) == 1
    d["k"] = 2  # a cached pickle of `d.get` would still say 1
    assert pool.submit(d.get, "k").result(timeout=60) == 2


def test_infinite_and_huge_timeouts_wait_nan_is_refused(pool):
    # Seconds that no Duration holds used to panic inside the native layer.
    assert pool.submit(tasks.add, 1, 2).result(timeout=float("inf")) == 3
    assert pool.submit(tasks.add, 1, 2).result(timeout=1e300) == 3
    t = pool.submit(tasks.add, 1, 2)
    with pytest.raises(ValueError, match="NaN"):
        t.result(float("nan"))
    assert t.result(timeout=60) == 3
    with pytest.raises(ValueError, match="NaN"):
        pymizu._native.wait_any([pool.submit(tasks.add, 1, 2)], float("nan"))


def test_a_subclass_can_override_submit():
    class Logged(pymizu.Pool):
        def submit(self, fn, /, *args, **kwargs):
            self.calls = getattr(self, "calls", 0) + 1
            return super().submit(fn, *args, **kwargs)

    with Logged(1) as p:
        assert p.submit(tasks.add, 1, 2).result(timeout=60) == 3
        assert p.calls == 1


def test_a_worker_gives_its_own_threads_the_interpreter_lock_during_and_after_a_stream():
    # A worker keeps the interpreter lock through a stream of tasks and must give it back
    # when it parks: a thread a task started keeps running (a lock kept while parked would
    # stop it for good).
    with pymizu.Pool(1) as p:
        wpid = p.submit(tasks.start_ticker).result()
        before, _ = p.submit(tasks.ticks).result()
        for _ in range(20_000):
            assert p.submit(tasks.add, 1, 2).result() == 3
        during, pid = p.submit(tasks.ticks).result()
        assert pid == wpid
        assert during > before
        # While the worker is parked, the thread runs freely: many ticks in a quiet 0.2 s
        # (with the lock kept, only about one per task that ends a sleep of the worker).
        deadline = time.monotonic() + 60  # a hang guard only
        prev = during
        while True:
            time.sleep(0.2)
            after, pid = p.submit(tasks.ticks).result()
            assert pid == wpid
            if after - prev > 5:
                break
            prev = after
            assert time.monotonic() < deadline, (before, during, after)


def test_the_machine_floor_the_benchmarks_print_is_measured_or_refused_clearly():
    from pymizu import _native

    ns = _native.line_round_trip_ns(0, 1, rounds=2000)
    assert 0 < ns < 1e6  # a cache line's round trip: nanoseconds, not milliseconds
    with pytest.raises(pymizu.MizuError, match="two different CPUs"):
        _native.line_round_trip_ns(0, 0)
    with pytest.raises(pymizu.MizuError):
        _native.line_round_trip_ns(0, 100_000)  # no such CPU: an error, not a hang


def test_multiprocessing_pool_calls_run_as_they_do_there():
    # Code written for multiprocessing.Pool: apply, apply_async / map_async / starmap_async
    # with callbacks and AsyncResult, then close() and join() (which waits for the work and
    # keeps the async results), and terminate().
    import multiprocessing
    import threading

    p = pymizu.Pool(2)
    assert p.apply(tasks.add, (1, 2)) == 3
    assert p.apply(tasks.add, (1,), {"b": 5}) == 6
    got, errs, ran = [], [], threading.Event()
    r = p.apply_async(tasks.add, (3, 4), callback=got.append)
    assert r.get(timeout=60) == 7 and r.ready() and r.successful()
    m = p.map_async(tasks.ident, range(50), chunksize=7, callback=lambda v: (got.append(v), ran.set()))
    assert m.get(timeout=60) == list(range(50))
    assert p.starmap_async(tasks.add, [(1, 2), (3, 4)]).get(timeout=60) == [3, 7]
    e = p.apply_async(tasks.boom, ("no",), error_callback=errs.append)
    with pytest.raises(ValueError, match="no"):
        e.get(timeout=60)
    assert not e.successful()
    fm = p.map_async(tasks.boom, ["first", "second"])
    with pytest.raises(ValueError, match="first"):
        fm.get(timeout=60)
    slow = p.apply_async(tasks.sleep, (0.3,))
    with pytest.raises(ValueError, match="not ready"):
        slow.successful()
    with pytest.raises(multiprocessing.TimeoutError):
        slow.get(timeout=0.01)
    with pytest.raises(ValueError, match="still running"):
        p.join()
    late = [p.apply_async(tasks.sleep, (0.05,)) for _ in range(6)]
    p.close()
    for call in (lambda: p.apply_async(tasks.add, (1, 1)), lambda: p.submit(tasks.add, 1, 1),
                 lambda: p.map(tasks.ident, [1])):
        with pytest.raises(ValueError, match="Pool not running"):
            call()
    p.join()
    assert all(r.ready() for r in late) and [r.get() for r in late] == [0.05] * 6
    assert slow.get() == 0.3
    assert ran.wait(60)
    assert got[0] == 7 and got[1] == list(range(50))
    deadline = time.monotonic() + 60
    while not errs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(errs) == 1 and str(errs[0]) == "no"

    q = pymizu.Pool(1)
    cut = q.apply_async(tasks.sleep, (30,))
    q.terminate()
    q.join()
    with pytest.raises(pymizu.MizuError):
        cut.get(timeout=60)
