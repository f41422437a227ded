"""A joblib parallel backend: `import pymizu.joblib`, then

    with joblib.parallel_config(backend="mizu", n_jobs=2):
        joblib.Parallel()(joblib.delayed(f)(i) for i in range(10_000))

runs joblib's batches of calls on a `pymizu.PoolExecutor` — and with them scikit-learn's
`n_jobs` estimators and everything else built on joblib. The executor is kept warm between
`Parallel` calls (one per worker count, closed at interpreter exit). Large numpy arrays and
pandas frames that a call passes (1 MiB or more) are copied into shared memory once per
`Parallel` call and reach the workers as read-only views, instead of joblib's memory-mapped
temporary files. Exceptions keep their types; `return_as="generator"`, automatic batching, `timeout` (a call that
outlives it raises `multiprocessing.TimeoutError`) and `initializer=` / `initargs=` (given to
`parallel_config` or `Parallel`, run once in every worker) work as with joblib's process
backends. A forked child process starts executors of its own.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
from typing import Any

import joblib
from joblib._parallel_backends import (
    AutoBatchingMixin,
    FallbackToBackend,
    ParallelBackendBase,
    SequentialBackend,
)
from joblib.parallel import BatchedCalls, parallel_config

from . import _codec, _share
from ._executor import PoolExecutor

__all__ = ["MizuBackend", "NAME"]

#: The name the backend is registered under.
NAME = "mizu"

_lock = threading.Lock()
# Warm executors, by worker count and thread limits, with the initializer their workers ran:
# the workers of one Parallel call serve the next.
_executors: dict[tuple, tuple[PoolExecutor, tuple]] = {}


def _init_worker(env: dict, initializer, initargs: tuple) -> None:
    """A worker's initializer: the thread pools of numerical libraries (BLAS, OpenMP) get the
    worker's share of the CPUs, as under joblib's own process backends, so that `n_jobs`
    processes do not oversubscribe the machine (through the environment for libraries loaded
    later, through threadpoolctl, when installed, for those loaded already); then the user's
    `initializer(*initargs)`, given to `parallel_config` or `Parallel`."""
    os.environ.update(env)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(limits=int(env["OMP_NUM_THREADS"]))
    if initializer is not None:
        initializer(*initargs)


def _same(a, b) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:
        return False


def _executor(n_jobs: int, env: dict, initializer, initargs: tuple) -> PoolExecutor:
    """The warm executor for `n_jobs` workers with these thread limits; one whose workers ran
    another initializer (or with other arguments) is replaced, as joblib's loky backend
    replaces its reusable executor."""
    key = (n_jobs, tuple(sorted(env.items())))
    init = (initializer, tuple(initargs))
    with _lock:
        held = _executors.get(key)
        if held is not None:
            ex, was = held
            if not ex._broken and ex._state.accepting and _same(was, init):
                return ex
            del _executors[key]
            ex.shutdown(wait=False)
        ex = PoolExecutor(n_jobs, initializer=_init_worker, initargs=(env, initializer, tuple(initargs)))
        _executors[key] = (ex, init)
        return ex


def _forget_after_fork() -> None:
    """A forked child cannot use its parent's workers (pymizu refuses with `ForkedError`): it
    starts its own executors, and leaves its parent's alone."""
    global _lock
    _lock = threading.Lock()
    _executors.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _discard(ex: PoolExecutor) -> None:
    """Stops `ex` now — queued calls cancelled, running ones killed — so a later call gets a
    fresh executor (joblib's abort after an error or a timeout)."""
    with _lock:
        for k, (v, _) in list(_executors.items()):
            if v is ex:
                del _executors[k]
    ex.shutdown(wait=False, cancel_futures=True)
    ex._mpool.stop(grace=0)


def _array_types() -> frozenset:
    """The types whose large instances are shared: numpy arrays and pandas frames and series
    (of the libraries this process has imported)."""
    types = []
    np = sys.modules.get("numpy")
    if np is not None:
        types.append(np.ndarray)
    pd = sys.modules.get("pandas")
    if pd is not None:
        types += [pd.DataFrame, pd.Series]
    return frozenset(types)


@atexit.register
def _close_all() -> None:
    with _lock:
        executors = [ex for ex, _ in _executors.values()]
        _executors.clear()
    for ex in executors:
        ex.shutdown(wait=False, cancel_futures=True)


def _run_batch(head: bytes, backend, n_jobs, calls: list) -> list:
    """(In a worker) what joblib's batch of calls of one function returns: its calls made in
    turn, under the backend joblib chose for calls nested in them, as `BatchedCalls` makes
    them."""
    f = _codec.fn_from_ref(head)
    with parallel_config(backend=backend, n_jobs=n_jobs):
        return [f(*args, **kwargs) for args, kwargs in calls]


class _Job:
    """A batch of calls joblib submitted: its future, and `ran`, a lock held until joblib's
    done-callback for it has run."""

    __slots__ = ("future", "callback", "ran")

    def __init__(self, future, callback):
        self.future = future
        self.callback = callback
        self.ran = threading.Lock()
        self.ran.acquire()

    def done(self, future) -> None:
        try:
            self.callback(future)
        finally:
            self.ran.release()


class MizuBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's backend API over a `pymizu.PoolExecutor` (see the module's docstring)."""

    supports_inner_max_num_threads = True

    def __init__(self, nesting_level=None, inner_max_num_threads=None, **kwargs):
        super().__init__(
            nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads, **kwargs
        )
        self._workers: PoolExecutor | None = None
        self._shared: dict[int, Any] = {}
        self._keep: list = []

    def effective_n_jobs(self, n_jobs):
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            n_jobs = max((os.cpu_count() or 1) + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **kwargs):
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self.parallel = parallel
        # What `parallel_config(backend="mizu", ...)` and `Parallel(...)` were given beyond
        # joblib's own parameters; of those, the workers' initializer applies here (memory
        # mapping's do not: large arrays are shared instead).
        given = {**self.backend_kwargs, **kwargs}
        self._workers = _executor(
            n_jobs,
            self._prepare_worker_env(n_jobs),
            given.get("initializer"),
            given.get("initargs", ()),
        )
        return n_jobs

    def submit(self, func, callback=None):
        func = self._share_large_arguments(func)
        future = self._submit_batch(func)
        if callback is None:
            return future
        job = _Job(future, callback)
        future.add_done_callback(job.done)
        return job

    @property
    def supports_retrieve_callback(self):
        """Whether joblib takes results from the done-callbacks: only for results in the order
        they finish (`return_as="generator_unordered"`, which needs it). In order, joblib's
        thread waits for each next result itself (`retrieve_result`): its callback retrieval
        would instead look every 10 ms for whether the next result has come."""
        parallel = getattr(self, "parallel", None)
        return parallel is None or not parallel.return_ordered

    # (Both hold whichever way results are retrieved.)
    supports_return_generator = True
    supports_timeout = True

    def retrieve_result_callback(self, future):
        return future.result()

    def retrieve_result(self, out, timeout=None):
        future = out.future if type(out) is _Job else out
        try:
            value = future.result(timeout)
        except TimeoutError:
            if future.done():
                raise  # the call's own TimeoutError
            # What joblib's process backends raise when a call outlives `timeout`.
            raise multiprocessing.TimeoutError() from None
        if type(out) is not _Job:
            return value
        # joblib's callback counts the batch complete (and dispatches the next one): until it
        # has, joblib's loop would take the call for unfinished and sleep 10 ms. The thread
        # that settled the future runs it right after.
        out.ran.acquire()
        out.ran.release()
        return value

    def stop_call(self):
        # The arrays shared for this Parallel call are let go (the workers' views keep what
        # is still in use).
        self._shared.clear()
        self._keep.clear()

    def terminate(self):
        # The executor stays warm for the next Parallel call; only this call's state goes.
        self.stop_call()
        self._workers = None
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready=True):
        ex = self._workers
        if ex is not None:
            _discard(ex)
            self._workers = None
        if ensure_ready:
            self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel)

    def _submit_batch(self, batch):
        """Submits joblib's batch of calls. A batch of calls of one function goes as
        `_run_batch` with that function's kept pickle (`_codec.fn_ref`, unpickled once per
        worker) and the calls' arguments, pickled as plain data. A batch sent whole is not
        pickled by value either (`_codec._dumps_kept` writes its functions as their kept
        pickles), but that walks it with a Python hook per object: a notebook's `Parallel` of
        100 to 10 000 trivial calls took 5–20% longer. Any other batch goes whole."""
        items = getattr(batch, "items", None)
        if type(batch) is BatchedCalls and items and type(items[0]) is tuple:
            f = items[0][0]
            if all(type(it) is tuple and len(it) == 3 and it[0] is f for it in items):
                head = _codec.fn_ref(f)
                if head is not None:
                    calls = [(args, kwargs) for _, args, kwargs in items]
                    return self._workers.submit(_run_batch, head, batch._backend, batch._n_jobs, calls)
        return self._workers.submit(batch)

    def _share_large_arguments(self, func):
        """joblib's batch of calls with every numpy array or pandas object of 1 MiB or more
        among the calls' arguments replaced by a shared copy, made once per Parallel call for
        each such object (recognised by identity; the original is kept alive meanwhile so its
        identity cannot be reused). The common batch, of small arguments only, costs one type
        lookup per argument."""
        items = getattr(func, "items", None)
        big = _array_types()
        if not big or not isinstance(items, list):
            return func
        for k, item in enumerate(items):
            if type(item) is not tuple or len(item) != 3:
                return func
            f, args, kwargs = item
            for a in args:
                if type(a) in big:
                    break
            else:
                if not kwargs:
                    continue
                for v in kwargs.values():
                    if type(v) in big:
                        break
                else:
                    continue
            args2 = tuple(self._shared_copy(a) if type(a) in big else a for a in args)
            kwargs2 = {k2: self._shared_copy(v) if type(v) in big else v for k2, v in kwargs.items()}
            items[k] = (f, args2, kwargs2)
        return func

    def _shared_copy(self, a):
        s = self._shared.get(id(a))
        if s is not None:
            return s
        if not _share._worth_sharing(a):
            return a
        s = self._shared[id(a)] = _share.share(a)
        self._keep.append(a)
        return s


joblib.register_parallel_backend(NAME, MizuBackend)
