"""`PoolExecutor`: the concurrent.futures drop-in."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from concurrent.futures import Executor, Future

from . import _native
from ._errors import ExecTimeoutError, RemoteTraceback, StoppedError, TaskError, WorkerDiedError


def _decode(status: int, payload: bytes, slot: int, pid: int) -> tuple[bool, object]:
    """(is_result, value-or-exception) from a native outcome."""
    if status == 0:
        return True, pickle.loads(payload)
    if status == 1:
        try:
            exc, tb = pickle.loads(payload)
        except Exception:
            return False, TaskError("RemoteError", payload.decode("utf-8", "replace"))
        if tb:
            exc.__cause__ = RemoteTraceback(tb)
        return False, exc
    if status == 2:
        return False, WorkerDiedError(slot, pid)
    if status == 3:
        return False, ExecTimeoutError(slot, pid)
    if status == 4:
        return False, StoppedError("the task was cancelled")
    return False, StoppedError("the pool stopped before the task ran")


class _MizuFuture(Future):
    """A real `Future`; `result()` collects the task in the calling thread (GIL released)
    instead of waiting for the collector thread to be scheduled."""

    def __init__(self, task):
        super().__init__()
        self._task = task
        self._born = time.monotonic()

    def _settle(self, outcome) -> None:
        if outcome is None or outcome[0] == 6:
            return
        ok, value = _decode(*outcome)
        with self._condition:
            if self._state != "PENDING" and self._state != "RUNNING":
                return
        if not self.set_running_or_notify_cancel():
            return
        if ok:
            self.set_result(value)
        else:
            self.set_exception(value)  # type: ignore[arg-type]

    def result(self, timeout=None):
        if not self.done():
            self._settle(self._task.result(timeout))
        return super().result(timeout)

    def exception(self, timeout=None):
        if not self.done():
            self._settle(self._task.result(timeout))
        return super().exception(timeout)

    def done(self) -> bool:
        if not super().done() and self._task.done():
            self._settle(self._task.result(0.0))
        return super().done()

    def cancel(self) -> bool:
        with self._condition:
            if self._state == "PENDING" and not self._task.cancel():
                return False
        return super().cancel()


class PoolExecutor(Executor):
    """A process pool executor over shared memory.

    Behaves as `ProcessPoolExecutor`: `submit` returns a real `concurrent.futures.Future` (so
    `wait`, `as_completed` and `asyncio.wrap_future` work), `map` and
    `shutdown(wait, cancel_futures=...)` work as documented there, an exception raised in a task
    is re-raised as the same type with the remote traceback as its `__cause__`, and a worker
    that dies fails its future with `WorkerDiedError` (a `BrokenProcessPool`) — but the pool
    replaces the worker and keeps serving.
    """

    def __init__(self, max_workers: int | None = None, *, exec_timeout: float | None = None):
        if max_workers is None:
            max_workers = os.cpu_count() or 1
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._pool = _native.Pool(max_workers, sys.executable, exec_timeout)
        self._lock = threading.Lock()
        self._pending: list[_MizuFuture] = []
        self._wakeup = threading.Event()
        self._shutdown = False
        self._starved = False
        self._collector = threading.Thread(target=self._collect, name="pymizu-collector", daemon=True)
        self._collector.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        # Pickling happens here, in the caller: an unpicklable call raises now, never hangs.
        payload = pickle.dumps((fn, args, kwargs), protocol=5)
        while True:
            with self._lock:
                if self._shutdown:
                    raise RuntimeError("cannot schedule new futures after shutdown")
                try:
                    fut = _MizuFuture(self._pool.submit(payload))
                except _native.SlotsFull:
                    self._starved = True
                else:
                    self._starved = False
                    self._pending.append(fut)
                    return fut
            # Every slot holds an uncollected result (e.g. a large `map`): let the collector
            # complete some futures, which frees their slots, then try again.
            self._wakeup.set()
            time.sleep(0.0002)

    def _collect(self) -> None:
        """Completes futures nobody is waiting on directly (callbacks, `wait`, `as_completed`).

        Callers that wait on their own futures settle them in their thread; then this thread
        finds nothing to do and backs off, so it seldom competes with them for the GIL.
        """
        delay = 0.0002
        while True:
            with self._lock:
                self._pending = [f for f in self._pending if not Future.done(f)]
                pending = list(self._pending)
                if self._shutdown and not pending:
                    return
                starved = self._starved or self._shutdown
            progressed = False
            now = time.monotonic()
            for fut in pending:
                # A caller blocked in `result()` collects its own future faster than this
                # thread can hand it over: settle only futures someone else waits on (`wait`,
                # `as_completed`, callbacks), old ones, or any when slots run out.
                wanted = fut._waiters or fut._done_callbacks or starved or now - fut._born > 0.01
                if wanted and fut._task.done():
                    fut._settle(fut._task.result(0.0))
                    progressed = True
            if progressed:
                delay = 0.0002
            else:
                self._wakeup.wait(delay if pending else 0.05)
                self._wakeup.clear()
                delay = min(delay * 2, 0.02)

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
            self._pool.stop(5.0)

    def _status(self):
        """Per worker: (slot, pid, state, busy, tasks) — for tests and diagnostics."""
        return self._pool.status()
