"""PoolExecutor behaves as ProcessPoolExecutor where programs written for the latter notice:
start methods, pickling failures, multiprocessing objects as arguments, interpreter exit,
dropped executors, `python -m` programs (real processes throughout)."""

import concurrent.futures as cf
import gc
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import threading
import weakref
from concurrent.futures.process import BrokenProcessPool

import pytest

import pymizu
import tasks

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def ex():
    with pymizu.PoolExecutor(2) as e:
        yield e


class Unpicklable:
    """Pickles fine, but raises when unpickled (on the other side)."""

    def __reduce__(self):
        return (tasks.fail_with, ("cannot be rebuilt here",))


class ExitOnUnpickle:
    def __reduce__(self):
        return (sys.exit, (3,))


def make_unpicklable_result():
    return Unpicklable()


def test_mp_context_spawn_or_none_is_accepted_and_other_methods_are_refused():
    for ctx in (None, mp.get_context("spawn")):
        with pymizu.PoolExecutor(1, ctx) as e:
            assert e._mp_context.get_start_method() == "spawn"
            assert e._max_workers == 1
            assert e.submit(tasks.add, 1, 2).result(timeout=60) == 3
    for method in ("fork", "forkserver"):
        with pytest.raises(ValueError, match="spawn"):
            pymizu.PoolExecutor(1, mp_context=mp.get_context(method))


def test_max_workers_must_be_a_positive_int():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="greater than 0"):
            pymizu.PoolExecutor(bad)
    for bad in ("2", 2.5, True):
        with pytest.raises(TypeError, match="max_workers must be an int"):
            pymizu.PoolExecutor(bad)


def test_positional_arguments_follow_process_pool_executor():
    with pymizu.PoolExecutor(1, None, tasks.set_global, ("initialised",)) as e:
        assert e.submit(tasks.get_global).result(timeout=60) == "initialised"


def test_an_argument_that_cannot_be_pickled_fails_its_future_not_submit(ex):
    f = ex.submit(tasks.add, threading.Lock(), 1)
    with pytest.raises(TypeError):
        f.result(timeout=60)


def test_a_call_that_cannot_be_unpickled_in_the_worker_is_a_broken_process_pool_error(ex):
    for bad in (Unpicklable(), ExitOnUnpickle()):
        with pytest.raises(BrokenProcessPool) as info:
            ex.submit(tasks.add, bad, 1).result(timeout=60)
        assert isinstance(info.value, pymizu.PayloadError)
    assert ex.submit(tasks.add, 1, 1).result(timeout=60) == 2, "the worker is fine"


def test_a_result_that_cannot_be_unpickled_is_a_broken_process_pool_error(ex):
    with pytest.raises(BrokenProcessPool, match="result could not be unpickled"):
        ex.submit(make_unpicklable_result).result(timeout=60)


def test_an_exception_that_cannot_be_unpickled_is_a_broken_process_pool_error(ex):
    # `ProcessPoolExecutor` reports it as a broken pool; here only its future fails.
    with pytest.raises(BrokenProcessPool, match="exception could not be unpickled") as info:
        ex.submit(tasks.raise_two_argument_error).result(timeout=60)
    assert isinstance(info.value, pymizu.PayloadError)
    assert isinstance(info.value.__cause__, TypeError), "the unpickling error is the cause"
    assert ex.submit(tasks.add, 1, 1).result(timeout=60) == 2, "the executor serves on"


def test_the_cause_of_a_task_exception_is_the_stdlib_remote_traceback(ex):
    with pytest.raises(ZeroDivisionError) as info:
        ex.submit(tasks.divide, 1, 0).result(timeout=60)
    cause = info.value.__cause__
    assert type(cause) is cf.process._RemoteTraceback
    assert "ZeroDivisionError" in cause.tb and "divide" in cause.tb


def test_multiprocessing_queues_locks_values_and_manager_proxies_travel_as_arguments(ex):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    assert ex.submit(tasks.put, q, 21).result(timeout=60) is None
    assert q.get(timeout=60) == 21
    lock, value = ctx.Lock(), ctx.Value("i", 0)
    assert sorted(ex.submit(tasks.locked_increment, lock, value).result(timeout=60) for _ in range(4)) == [1, 2, 3, 4]
    with ctx.Manager() as m:
        d = m.dict()
        for i in range(3):
            ex.submit(tasks.store, d, i, i * 10).result(timeout=60)
        assert dict(d) == {0: 0, 1: 10, 2: 20}


def test_a_multiprocessing_queue_in_initargs_reaches_every_worker():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with pymizu.PoolExecutor(2, ctx, tasks.announce, (q,)) as e:
        # Two tasks in flight: the second worker starts too (workers start as work needs them).
        for f in [e.submit(tasks.sleep, 0.2) for _ in range(2)]:
            f.result(timeout=60)
        pids = {q.get(timeout=60) for _ in range(2)}
        assert len(pids) == 2 and os.getpid() not in pids


def test_a_failing_initializer_breaks_the_executor_and_logs_through_a_queue():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    e = pymizu.PoolExecutor(1, ctx, tasks.fail_initializer, (q,))
    try:
        with pytest.raises(BrokenProcessPool):
            e.submit(tasks.add, 1, 1).result(timeout=60)
        assert e._broken
        with pytest.raises(BrokenProcessPool):
            e.submit(tasks.add, 1, 1)
        record = q.get(timeout=60)
        assert "initializer failed on purpose" in record.getMessage()
    finally:
        e.shutdown()


def test_map_keeps_no_reference_to_results_it_yielded(ex):
    for obj in ex.map(tasks.make_object, range(10), chunksize=3):
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        assert ref() is None


def _python(*argv: str, cwd=None):
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )


def _run(code: str):
    return _python("-c", textwrap.dedent(code))


def test_work_pending_at_interpreter_exit_runs_and_later_submissions_raise():
    code = """
        import atexit, pymizu, tasks

        @atexit.register
        def late():
            try:
                ex.submit(tasks.add, 1, 1)
            except RuntimeError as e:
                print("refused:", e, flush=True)

        ex = pymizu.PoolExecutor(2)
        ex.submit(tasks.sleep_and_print, 0.5, "finished at exit")
    """
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert "finished at exit" in r.stdout
    assert "refused: cannot schedule new futures after interpreter shutdown" in r.stdout


def test_an_executor_nobody_names_runs_what_it_was_given_then_goes():
    # `PoolExecutor(1).submit(f)`: the executor is dropped between looking up `submit` and
    # calling it; a bound method would keep it, as ProcessPoolExecutor's does. So does a
    # `submit` held after the executor is deleted. Once both are gone, it is released.
    code = """
        import gc, threading, pymizu, tasks

        print("unnamed", pymizu.PoolExecutor(1).submit(tasks.add, 2, 3).result(timeout=60))
        futs = [pymizu.PoolExecutor(2).submit(tasks.add, i, i) for i in range(3)]
        print("several", [f.result(timeout=60) for f in futs])
        ex = pymizu.PoolExecutor(2)
        collector = ex._executor_manager_thread
        submit = ex.submit
        del ex
        gc.collect()
        print("held", submit(tasks.add, 4, 5).result(timeout=60))
        del submit
        gc.collect()
        collector.join(60)
        assert not collector.is_alive(), "collector thread left running"
    """
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert "unnamed 5" in r.stdout
    assert "several [0, 2, 4]" in r.stdout
    assert "held 9" in r.stdout


def test_a_dropped_executor_leaves_no_thread_or_worker_behind():
    code = """
        import gc, os, threading, time, pymizu, tasks

        ex = pymizu.PoolExecutor(2)
        pids = [row[1] for row in ex._status()]
        results = ex.map(tasks.add, range(5), range(5))
        collector = ex._executor_manager_thread
        del ex
        gc.collect()
        collector.join(60)
        assert not collector.is_alive(), "collector thread left running"
        assert list(results) == [0, 2, 4, 6, 8]
        for pid in pids:
            deadline = time.monotonic() + 60
            while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
                assert time.monotonic() < deadline, f"worker {pid} left running"
                time.sleep(0.01)
        print("clean", [t.name for t in threading.enumerate()])
    """
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert "clean ['MainThread']" in r.stdout


def test_a_program_run_with_dash_m_is_not_rerun_by_the_workers(tmp_path):
    pkg = tmp_path / "prog"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "work.py").write_text("def square(x):\n    return x * x\n")
    (pkg / "__main__.py").write_text(
        textwrap.dedent(
            """
            import os, pymizu
            from prog.work import square
            print("main ran in", os.getpid(), flush=True)
            with pymizu.PoolExecutor(2) as ex:
                print("result", list(ex.map(square, range(4))), flush=True)
            """
        )
    )
    (pkg / "tool.py").write_text(
        textwrap.dedent(
            """
            import os, pymizu

            def cube(x):
                return x ** 3

            if __name__ == "__main__":
                print("main ran in", os.getpid(), flush=True)
                with pymizu.PoolExecutor(2) as ex:
                    print("result", list(ex.map(cube, range(4))), flush=True)
            """
        )
    )
    r = _python("-m", "prog", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("main ran in") == 1, r.stdout
    assert "result [0, 1, 4, 9]" in r.stdout
    r = _python("-m", "prog.tool", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("main ran in") == 1, r.stdout
    assert "result [0, 1, 8, 27]" in r.stdout


def test_unittest_run_with_dash_m_uses_the_executor(tmp_path):
    (tmp_path / "test_square.py").write_text(
        textwrap.dedent(
            """
            import unittest, pymizu

            def square(x):
                return x * x

            class T(unittest.TestCase):
                def test_map(self):
                    with pymizu.PoolExecutor(2) as ex:
                        self.assertEqual(list(ex.map(square, range(4))), [0, 1, 4, 9])
            """
        )
    )
    r = _python("-m", "unittest", "-v", "test_square", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("Ran 1 test") == 1, r.stderr
