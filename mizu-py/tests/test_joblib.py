"""The joblib backend (`import pymizu.joblib`): joblib's Parallel and scikit-learn's n_jobs on
real mizu worker processes."""

import multiprocessing
import os
import time

import numpy as np
import pytest
from joblib import Parallel, delayed, parallel_config

import pymizu
import pymizu.joblib  # noqa: F401  (registers the backend)


def _pid(_):
    return os.getpid()


def _square(x):
    return x * x


def _fail_on(i, bad):
    if i == bad:
        raise KeyError(f"element {i}")
    return i


def _describe(a):
    return (pymizu.is_shared(a), a.flags.writeable, type(a).__name__, float(a[:10].sum()))


def _nested(i):
    return sum(Parallel(n_jobs=2)(delayed(_square)(j) for j in range(i)))


def test_parallel_runs_on_mizu_workers_and_stays_warm():
    with parallel_config(backend="mizu", n_jobs=2):
        out = Parallel()(delayed(_square)(i) for i in range(2000))
        env = pymizu.joblib.MizuBackend()._prepare_worker_env(2)
        ex, _ = pymizu.joblib._executors[(2, tuple(sorted(env.items())))]
        workers = set(ex._processes)
        pids_a = set(Parallel()(delayed(_pid)(i) for i in range(200)))
        pids_b = set(Parallel()(delayed(_pid)(i) for i in range(200)))
        # Later Parallel calls ran on the same (warm) executor and worker processes.
        assert pymizu.joblib._executors[(2, tuple(sorted(env.items())))][0] is ex
    assert out == [i * i for i in range(2000)]
    assert len(workers) == 2 and os.getpid() not in workers
    assert pids_a | pids_b <= workers


def _thread_limits(_):
    import numpy  # noqa: F401  (its BLAS is loaded)
    from threadpoolctl import threadpool_info

    return os.environ.get("OMP_NUM_THREADS"), sorted({p["num_threads"] for p in threadpool_info()})


def test_workers_limit_numerical_thread_pools_as_joblib_backends_do():
    with parallel_config(backend="mizu", n_jobs=2, inner_max_num_threads=3):
        env, pools = Parallel()(delayed(_thread_limits)(i) for i in range(1))[0]
    assert env == "3"
    assert pools and set(pools) == {3}
    with parallel_config(backend="mizu", n_jobs=2):
        env, pools = Parallel()(delayed(_thread_limits)(i) for i in range(1))[0]
    expected = max((os.cpu_count() or 1) // 2, 1)
    assert env == os.environ.get("OMP_NUM_THREADS", str(expected))


def test_exceptions_keep_their_types():
    with parallel_config(backend="mizu", n_jobs=2):
        with pytest.raises(KeyError, match="element 7"):
            Parallel()(delayed(_fail_on)(i, 7) for i in range(50))
        # The backend serves on after an error.
        assert Parallel()(delayed(_square)(i) for i in range(5)) == [0, 1, 4, 9, 16]


def test_generators_and_batching():
    with parallel_config(backend="mizu", n_jobs=2):
        gen = Parallel(return_as="generator")(delayed(_square)(i) for i in range(100))
        assert not isinstance(gen, list)
        assert list(gen) == [i * i for i in range(100)]
        unordered = Parallel(return_as="generator_unordered")(delayed(_square)(i) for i in range(100))
        assert sorted(unordered) == [i * i for i in range(100)]
        assert Parallel(batch_size=7)(delayed(_square)(i) for i in range(50)) == [i * i for i in range(50)]


class _CountingTime:
    """joblib's `time` module, counting the sleeps of its retrieval loop."""

    def __init__(self, real):
        self._real = real
        self.sleeps = 0

    def sleep(self, s):
        self.sleeps += 1
        self._real.sleep(s)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_the_caller_waits_for_results_in_order_instead_of_polling(monkeypatch):
    import joblib.parallel

    clock = _CountingTime(time)
    monkeypatch.setattr(joblib.parallel, "time", clock)
    with parallel_config(backend="mizu", n_jobs=2):
        # Calls that outlast the dispatch: each next result is still running when looked for.
        assert Parallel()(delayed(_slow_square)(i) for i in range(12)) == [i * i for i in range(12)]
        assert clock.sleeps == 0
        gen = Parallel(return_as="generator")(delayed(_slow_square)(i) for i in range(6))
        assert list(gen) == [i * i for i in range(6)]
        assert clock.sleeps == 0
        # In the order they finish, joblib takes results from the callbacks (and polls).
        unordered = Parallel(return_as="generator_unordered")(delayed(_slow_square)(i) for i in range(6))
        assert sorted(unordered) == [i * i for i in range(6)]


def _slow_square(x):
    time.sleep(0.02)
    return x * x


def test_timeout_stops_the_call_and_the_backend_recovers():
    with parallel_config(backend="mizu", n_jobs=2):
        t0 = time.monotonic()
        # What users of joblib's process backends catch (not the built-in TimeoutError).
        with pytest.raises(multiprocessing.TimeoutError):
            Parallel(timeout=0.5)(delayed(time.sleep)(s) for s in [0.01, 30, 30])
        assert time.monotonic() - t0 < 20  # hang guard: the sleeping workers were stopped
        assert Parallel()(delayed(_square)(i) for i in range(4)) == [0, 1, 4, 9]


def _raise_timeout(i):
    raise TimeoutError(f"call {i} timed out on its own")


def test_a_calls_own_timeout_error_is_not_joblibs():
    with parallel_config(backend="mizu", n_jobs=2):
        with pytest.raises(TimeoutError, match="call 3 timed out on its own"):
            Parallel(timeout=30)(delayed(_raise_timeout)(i) for i in [3])


_INITIALIZED = []


def _initialize(tag, into):
    _INITIALIZED.append((tag, into))


def _initialized(_):
    return list(_INITIALIZED), os.getpid()


def test_initializer_runs_once_in_every_worker():
    # Given to parallel_config (the backend's constructor) and to Parallel (its configure).
    for config, call in [
        ({"initializer": _initialize, "initargs": ("config", 1)}, {}),
        ({}, {"initializer": _initialize, "initargs": ("parallel", 2)}),
    ]:
        expected = [(config or call)["initargs"]]
        with parallel_config(backend="mizu", n_jobs=2, **config):
            out = Parallel(batch_size=1, **call)(delayed(_initialized)(i) for i in range(8))
        assert {tuple(map(tuple, seen)) for seen, _ in out} == {tuple(expected)}
        assert _INITIALIZED == []  # never in the caller
    # Without one, the warm workers are not those an initializer ran in.
    with parallel_config(backend="mizu", n_jobs=2):
        assert {tuple(seen) for seen, _ in Parallel()(delayed(_initialized)(i) for i in range(4))} == {()}


def _child_runs_its_own(write_fd):
    try:
        with parallel_config(backend="mizu", n_jobs=2):
            out = Parallel()(delayed(_square)(i) for i in range(6))
        os.write(write_fd, repr(out).encode())
    except BaseException as e:
        os.write(write_fd, f"{type(e).__name__}: {e}".encode())


def test_a_forked_child_starts_its_own_executor():
    with parallel_config(backend="mizu", n_jobs=2):
        assert Parallel()(delayed(_square)(i) for i in range(4)) == [0, 1, 4, 9]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _child_runs_its_own(w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert said == repr([i * i for i in range(6)])
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's executor still serves it.
    with parallel_config(backend="mizu", n_jobs=2):
        assert Parallel()(delayed(_square)(i) for i in range(4)) == [0, 1, 4, 9]


def test_large_arrays_cross_as_shared_views_not_memmaps():
    big = np.arange(2_000_000, dtype=np.float64)  # 16 MB
    with parallel_config(backend="mizu", n_jobs=2):
        out = Parallel()(delayed(_describe)(big) for _ in range(6))
    for shared, writeable, kind, head in out:
        assert shared and not writeable
        assert kind == "ndarray"  # not joblib's np.memmap
        assert head == float(big[:10].sum())
    # The caller's array is untouched and still its own.
    assert big.flags.writeable and not pymizu.is_shared(big)


def test_one_job_falls_back_to_sequential_and_nesting_works():
    with parallel_config(backend="mizu", n_jobs=1):
        assert set(Parallel()(delayed(_pid)(i) for i in range(3))) == {os.getpid()}
    with parallel_config(backend="mizu", n_jobs=2):
        assert Parallel()(delayed(_nested)(i) for i in range(5)) == [
            sum(j * j for j in range(i)) for i in range(5)
        ]


def test_sharedmem_requirement_is_refused_clearly():
    with parallel_config(backend="mizu", n_jobs=2):
        # joblib moves a call that requires shared memory to its threading backend.
        assert Parallel(require="sharedmem")(delayed(_square)(i) for i in range(3)) == [0, 1, 4]


def test_scikit_learn_gives_the_results_of_the_loky_backend():
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, cross_val_score

    X, y = make_classification(n_samples=300, n_features=8, random_state=0)
    results = {}
    for backend in ("loky", "mizu"):
        with parallel_config(backend=backend, n_jobs=2):
            scores = cross_val_score(LogisticRegression(max_iter=500), X, y, cv=5, n_jobs=2)
            grid = GridSearchCV(LogisticRegression(max_iter=500), {"C": [0.1, 1.0, 10.0]}, cv=3, n_jobs=2)
            grid.fit(X, y)
            forest = RandomForestClassifier(n_estimators=20, random_state=0, n_jobs=2).fit(X, y)
        results[backend] = (scores, grid.best_params_, grid.cv_results_["mean_test_score"], forest.predict(X))
    loky, mizu = results["loky"], results["mizu"]
    np.testing.assert_array_equal(mizu[0], loky[0])
    assert mizu[1] == loky[1]
    np.testing.assert_array_equal(mizu[2], loky[2])
    np.testing.assert_array_equal(mizu[3], loky[3])
