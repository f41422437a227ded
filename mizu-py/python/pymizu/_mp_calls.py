"""`multiprocessing.Pool`'s calls on `pymizu.Pool`, so that code written for it runs on a
pymizu pool as it is: `apply`, `apply_async`, `map_async`, `starmap_async`, `close`, `join`,
`terminate`, and the `AsyncResult` the asynchronous ones return. They are `submit` and
`submit_batch` underneath; `map` and `starmap` themselves are pymizu's (`map(fn,
*iterables)` takes several iterables, so `chunksize` is a keyword there)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import threading
import time
import weakref
from typing import Any, Callable, Iterable


def _refuse(*_args, **_kwargs):
    raise ValueError("Pool not running")


class AsyncResult:
    """The outcome of `apply_async` (one call) or `map_async` / `starmap_async` (a list of
    results in input order), as `multiprocessing.pool.AsyncResult` has it: `get(timeout)`,
    `wait(timeout)`, `ready()`, `successful()`. `callback(value)` or, on failure,
    `error_callback(exception)` runs once every call is done, in the thread that finds the
    last one done (pymizu's watcher thread, or the caller's if it was done at once)."""

    def __init__(self, tasks: list, one: bool, callback=None, error_callback=None):
        self._tasks = tasks
        self._one = one
        if callback is None and error_callback is None:
            return
        left = [len(tasks)]
        lock = threading.Lock()

        def done(_task):
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            exc = self._failure()
            if exc is None:
                if callback is not None:
                    callback(self._value())
            elif error_callback is not None:
                error_callback(exc)

        if not tasks:
            left[0] = 1
            done(None)
        for t in tasks:
            t.add_done_callback(done)

    def _failure(self) -> BaseException | None:
        """The first failed call's exception (in input order), of calls that are done."""
        for t in self._tasks:
            try:
                e = t.exception(timeout=0)
            except cf.CancelledError as c:
                return c
            if e is not None:
                return e
        return None

    def _value(self) -> Any:
        if self._one:
            return self._tasks[0].result()
        return [t.result() for t in self._tasks]

    def ready(self) -> bool:
        """Whether every call is done."""
        return all(t.done() for t in self._tasks)

    def successful(self) -> bool:
        """Whether every call returned; a `ValueError` while some are not done."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._failure() is None

    def wait(self, timeout: float | None = None) -> None:
        """Waits until every call is done, or `timeout` seconds."""
        cf.wait(self._tasks, timeout=timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The result (a list for a map), or the first failed call's exception raised;
        `multiprocessing.TimeoutError` when not done within `timeout` seconds."""
        self.wait(timeout)
        if not self.ready():
            raise multiprocessing.TimeoutError
        return self._value()


class MultiprocessingCalls:
    """The part of `multiprocessing.Pool`'s interface `Pool` takes on (see the module)."""

    _closed = False
    _terminated = False

    def apply(self, func: Callable, args: tuple = (), kwds: dict | None = None) -> Any:
        """`func(*args, **kwds)` in a worker; waits for its result."""
        return self.submit(func, *args, **(kwds or {})).result()

    def _held(self, r: AsyncResult) -> AsyncResult:
        # (What `join()` collects before it stops the workers: their outcomes live in the
        # pool's shared memory until then.)
        held = self.__dict__.setdefault("_async_results", weakref.WeakSet())
        held.add(r)
        return r

    def apply_async(self, func: Callable, args: tuple = (), kwds: dict | None = None,
                    callback: Callable | None = None,
                    error_callback: Callable | None = None) -> AsyncResult:
        """Submits `func(*args, **kwds)`; its `AsyncResult`."""
        t = self.submit(func, *args, **(kwds or {}))
        return self._held(AsyncResult([t], True, callback, error_callback))

    def map_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                  callback: Callable | None = None,
                  error_callback: Callable | None = None) -> AsyncResult:
        """Submits `func(x)` for each `x` (in chunks, as `submit_batch`); an `AsyncResult` of
        the list of results."""
        tasks = self.submit_batch(func, [(x,) for x in iterable], chunksize)
        return self._held(AsyncResult(tasks, False, callback, error_callback))

    def starmap_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                      callback: Callable | None = None,
                      error_callback: Callable | None = None) -> AsyncResult:
        """Submits `func(*args)` for each `args`; an `AsyncResult` of the list of results."""
        tasks = self.submit_batch(func, [tuple(a) for a in iterable], chunksize)
        return self._held(AsyncResult(tasks, False, callback, error_callback))

    def close(self) -> None:
        """Takes no more work (a submission raises `ValueError`); what was submitted runs.
        `join()` then waits for it and stops the workers."""
        self._closed = True
        for name in ("submit", "submit_batch", "map", "starmap", "imap", "imap_unordered",
                     "_submit_raw", "_submit_small", "_submit_all", "_submit_calls",
                     "_submit_chunks", "_xsubmit", "_ximap"):
            setattr(self, name, _refuse)

    def terminate(self) -> None:
        """Stops the workers now: work not finished is lost (as `stop(grace=0)`)."""
        self.close()
        self._terminated = True
        self.stop(grace=0.0)

    def join(self) -> None:
        """After `close()`: waits until every task submitted is done, then stops the workers;
        the results of `apply_async` / `map_async` stay available (those of `submit` go with
        the workers unless collected). After `terminate()`: returns at once (the workers are
        gone). Before either, `ValueError`."""
        if not self._closed:
            raise ValueError("Pool is still running")
        if self._terminated:
            return
        while self._pool.unfinished():
            time.sleep(0.001)
        for r in list(self.__dict__.get("_async_results", ())):
            for t in r._tasks:
                try:
                    t.exception()  # moves the outcome into the task
                except cf.CancelledError:
                    pass
        self.stop()
