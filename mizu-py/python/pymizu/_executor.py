"""`PoolExecutor`: the concurrent.futures drop-in."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Executor, Future

from . import _codec, _native
from ._errors import CancelledError
from ._pool import Pool, _run_chunk


_PENDING, _FINISHED = "PENDING", "FINISHED"
# Seconds a future's first waiter other than `result()` looks for the outcome itself.
_WATCH_SPIN = 20e-6


def _lazy_list(key: str) -> property:
    """An attribute holding a list made on first use (under `key` in the instance dict)."""

    def get(self):
        return self.__dict__.setdefault(key, [])

    def put(self, v):
        self.__dict__[key] = v

    return property(get, put)


class _MizuFuture(Future):
    """A real `Future`; `result()` collects the task in the calling thread (GIL released while
    it waits) instead of waiting for the collector thread to be scheduled.

    Made without `Future.__init__` (see `PoolExecutor.submit`): its immutable fields are class
    defaults, and its condition and lists are made on first use — most futures are settled by
    the thread that waits on them and never need them. Settling writes the outcome first and
    then looks for a condition: a thread that made one before that look is notified under it;
    one that makes it later finds the future finished when it checks, under it, as the base
    class does. The notification happens once (`_notified`), whoever of the caller and the
    collector thread settles too.
    """

    _state = _PENDING
    _result = None
    _exception = None
    _task = None
    _pending = None
    _kick = None

    @property
    def _condition(self):
        d = self.__dict__
        c = d.get("_cond")
        if c is None:
            # Someone other than `result()` is about to wait on this future (`wait`,
            # `as_completed`, a done-callback, asyncio). A short task's outcome arrives within
            # microseconds: look for it first (as `result()` does), so that such a caller
            # finds the future finished instead of waiting for two thread wake-ups.
            task = self._task
            if self._state == _PENDING and task is not None:
                end = time.perf_counter() + _WATCH_SPIN
                while not task.done() and time.perf_counter() < end:
                    pass
                if task.done():
                    outcome = task._outcome(0.0)
                    # (A cancelled task settles through `cancel()`, which needs the condition.)
                    if outcome is not None and not isinstance(outcome[1], CancelledError):
                        self._settle(outcome)
            c = d.setdefault("_cond", threading.Condition())
            # Else the collector thread watches it from now on.
            kick = self._kick
            if kick is not None and self._state == _PENDING:
                kick()
        return c

    _waiters = _lazy_list("_waiter_list")
    _done_callbacks = _lazy_list("_callback_list")

    def _settle(self, outcome) -> None:
        """Completes the future with the task's outcome (the caller and the collector thread
        may both do it, with the same outcome)."""
        if outcome is None or self._state != _PENDING:
            return
        self._pending.pop(self, None)
        ok, value = outcome
        if ok:
            self._result = value
        elif isinstance(value, CancelledError):
            self.cancel()
            return
        else:
            self._exception = value
        self._state = _FINISHED
        if "_cond" in self.__dict__:
            self._notify(ok)

    def _notify(self, ok: bool) -> None:
        """What `set_result`/`set_exception` do after the state changed, once."""
        c = self._condition
        with c:
            if self.__dict__.get("_notified"):
                return
            self._notified = True
            for waiter in self._waiters:
                if ok:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            c.notify_all()
        if self._done_callbacks:
            self._invoke_callbacks()

    def result(self, timeout=None):
        if self._state == _PENDING:
            outcome = self._task._outcome(timeout)
            if outcome is None:  # not within `timeout` (waiting again would double it)
                raise TimeoutError()
            if outcome[0] and self._state == _PENDING:
                # `_settle` of a value, inline: the round trip's hot path.
                self._pending.pop(self, None)
                self._result = value = outcome[1]
                self._state = _FINISHED
                if "_cond" in self.__dict__:
                    self._notify(True)
                return value
            self._settle(outcome)
        if self._state == _FINISHED and self._exception is None:
            return self._result
        return super().result(0)

    def exception(self, timeout=None):
        if self._state == _PENDING:
            self._settle(self._task._outcome(timeout))
            if self._state == _PENDING:
                raise TimeoutError()
        return super().exception(0)

    def done(self) -> bool:
        if self._state == _PENDING and self._task.done():
            self._settle(self._task._outcome(0.0))
        return self._state != _PENDING

    def cancel(self) -> bool:
        with self._condition:
            if self._state == _PENDING and not self._task.cancel():
                return False
        self._pending.pop(self, None)
        if not super().cancel():
            return False
        # The task will never run: what ProcessPoolExecutor does when it drops a cancelled
        # work item, so that `wait` and `as_completed` count the future as done.
        if self._state == "CANCELLED":
            self.set_running_or_notify_cancel()
        return True


_new_future = object.__new__


class PoolExecutor(Executor):
    """A process pool executor over shared memory.

    Behaves as `ProcessPoolExecutor`: `submit` returns a real `concurrent.futures.Future` (so
    `wait`, `as_completed` and `asyncio.wrap_future` work), `map` and
    `shutdown(wait, cancel_futures=...)` work as documented there, an exception raised in a task
    is re-raised as the same type with the remote traceback as its `__cause__`, and a worker
    that dies fails its future with `WorkerDiedError` (a `BrokenProcessPool`) — but the pool
    replaces the worker and keeps serving.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer=None,
        initargs: tuple = (),
        max_tasks_per_child: int | None = None,
        exec_timeout: float | None = None,
    ):
        if max_workers is not None and (not isinstance(max_workers, int) or max_workers <= 0):
            raise ValueError("max_workers must be greater than 0")
        self._mpool = Pool(
            max_workers,
            initializer=initializer,
            initargs=initargs,
            max_tasks_per_child=max_tasks_per_child,
            exec_timeout=exec_timeout,
        )
        self._pool = self._mpool._pool
        self._lock = threading.Lock()
        # Futures not settled yet (settling removes them): what the collector looks at.
        self._pending: dict[_MizuFuture, None] = {}
        self._wakeup = threading.Event()
        self._kick = self._wakeup.set
        # Rounds the collector thread made (tests: it waits for events, it does not poll).
        self._collector_rounds = 0
        self._shutdown = False
        self._collector = threading.Thread(target=self._collect, name="pymizu-collector", daemon=True)
        self._collector.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        # No lock on this hot path: a submit racing `shutdown` looks at the flag again once
        # its future is registered (where shutdown and the collector find it), and withdraws
        # it if shutdown began meanwhile.
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        # Pickling happens here, in the caller: an unpicklable call raises now, never hangs
        # (small calls are written natively). The native submit refuses a forked child's copy
        # of the pool. When every task slot holds an uncollected result (e.g. a large `map`),
        # it moves finished outcomes into their tasks to make room.
        fut = _new_future(_MizuFuture)
        fut._task = task = self._pool.submit_call(fn, *args, **kwargs)
        fut._pending = pending = self._pending
        fut._kick = self._kick
        pending[fut] = None
        if self._shutdown:
            pending.pop(fut, None)
            task.cancel()
            raise RuntimeError("cannot schedule new futures after shutdown")
        return fut

    def _submit_payload(self, data, bufs) -> _MizuFuture:
        self._mpool._check()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            fut = _new_future(_MizuFuture)
            fut._task = self._pool.submit(data, bufs)
            fut._pending = self._pending
            fut._kick = self._kick
            self._pending[fut] = None
            return fut

    def map(self, fn, *iterables, timeout: float | None = None, chunksize: int | None = None):
        """As `ProcessPoolExecutor.map`: an iterator of `fn(*xs)` in input order, raising
        `TimeoutError` when a result is not ready `timeout` seconds after the call. Elements
        travel in chunks of `chunksize` (default: about four chunks per worker)."""
        if chunksize is not None and (not isinstance(chunksize, int) or chunksize < 1):
            raise ValueError("chunksize must be >= 1.")
        items = list(zip(*iterables))
        n = len(items)
        if chunksize is None:
            chunksize = max(1, -(-n // (4 * self._mpool.workers)))
        deadline = None if timeout is None else time.monotonic() + timeout
        futs = [
            self._submit_payload(*_codec.dumps_call(_run_chunk, (fn, s, items[s : s + chunksize], True, None, 0), {}))
            for s in range(0, n, chunksize)
        ]

        def results():
            try:
                futs.reverse()
                while futs:
                    f = futs[-1]
                    if deadline is None:
                        chunk = f.result()
                    else:
                        chunk = f.result(deadline - time.monotonic())
                    futs.pop()
                    yield from chunk
            finally:
                for f in futs:
                    f.cancel()

        return results()

    def _collect(self) -> None:
        """Completes the futures somebody other than `result()` waits on: `wait`,
        `as_completed`, done-callbacks (asyncio's `wrap_future`, `run_in_executor`, Dask,
        joblib). Such a future has a condition (`_condition` makes it and kicks this thread).

        While any is pending, this thread waits natively (GIL released) for the tasks of
        those futures — the pool wakes it when one finishes, after a short spin — and settles
        them at once. With none watched it sleeps on its event: nothing spins or polls while
        nothing is pending, and callers blocked in `result()` settle their own futures.
        """
        while True:
            self._collector_rounds += 1
            with self._lock:
                pending = list(self._pending)
                if self._shutdown and not pending:
                    return
                closing = self._shutdown
            watched = [f for f in pending if closing or "_cond" in f.__dict__]
            settled = False
            for fut in watched:
                if fut._task.done():
                    fut._settle(fut._task._outcome(0.0))
                    settled = True
            if settled:
                continue
            if watched:
                # Returns when one of them finishes (or after a slice: a kick for another
                # future, or shutdown, is seen then at the latest).
                _native.wait_any([f._task for f in watched], 0.05)
            else:
                self._wakeup.wait()
            self._wakeup.clear()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            pending = list(self._pending)
        if cancel_futures:
            for fut in pending:
                fut.cancel()
        self._wakeup.set()
        if wait:
            self._collector.join()
            self._mpool.stop(5.0)
        else:
            # As ProcessPoolExecutor: return now, release the workers once the work is done.
            def finish():
                self._collector.join()
                self._mpool.stop(5.0)

            threading.Thread(target=finish, name="pymizu-shutdown", daemon=True).start()

    def _status(self):
        """Per worker: (slot, pid, state, busy, tasks) — for tests and diagnostics."""
        return self._pool.status()
