"""The futures `PoolExecutor` returns: `concurrent.futures.Future`s whose outcome is read from
their task natively (`result()`), whose waiters look for a short outcome themselves before
they sleep, and whose `asyncio` hand-over needs no wake-up round when the loop itself saw the
task finish."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import Future
from concurrent.futures._base import LOGGER as _LOGGER

from . import _native
from ._errors import CancelledError, InitializerError, WorkerDiedError
from ._loops import _CHAIN, hand_over_soon, watch_in_loop
from ._task_futures import _WaiterEvent


_PENDING, _FINISHED = "PENDING", "FINISHED"
_CANCELLED = ("CANCELLED", "CANCELLED_AND_NOTIFIED")
_store = object.__setattr__
# Seconds a future's first waiter other than `result()` looks for the outcome itself.
_WATCH_SPIN = 20e-6
# Seconds without such looks after one that found its task still running (see `_condition`).
_WATCH_PAUSE = 1e-3
_watch_again = 0.0
# A waiter longer than this looks, once per slice, whether a worker died (which breaks the
# executor, as it breaks a ProcessPoolExecutor); a short task never reaches it.
_SLICE = 0.1


_track = _native.gc_track
_settle_done = _native.settle_done
# What a running event loop that saw a future's task finish does (see `_CallbackList`).
_settle_watched = _native.settle_watched
_running_loop = asyncio._get_running_loop
# A task's failures that settle its future otherwise than as its exception (`_settle`).
_SETTLED_APART = (CancelledError, WorkerDiedError, InitializerError)
# Held while a future's condition is made, and while a future without one is settled (see
# `_MizuFuture._finish`).
_MADE = threading.Lock()


class _WaiterList(list):
    """A future's waiters: a waiter added while the future is pending waits on a
    `_WaiterEvent` that knows the future."""

    __slots__ = ("_future",)

    def append(self, waiter) -> None:
        fut = self._future
        if fut._state == _PENDING:
            ev = waiter.event
            if type(ev) is not _WaiterEvent:
                ev = waiter.event = _WaiterEvent(ev.is_set())
            ev._futures.append(fut)
        list.append(self, waiter)


class _CallbackList(list):
    """A future's done-callbacks: one added while the future is pending has the future
    watched, to run it as soon as the task finishes — by the running event loop of the thread
    that adds it, while a CPU is free for that (asyncio's `wrap_future`, `run_in_executor`),
    else by the executor's collector thread."""

    __slots__ = ("_future",)

    def append(self, fn) -> None:
        list.append(self, fn)
        fut = self._future
        if fut._state == _PENDING:
            task = fut._task
            kick = fut._owner.kick
            settle = functools.partial(_settle_watched, fut, _CHAIN)
            if task is None or not watch_in_loop(task, settle, kick):
                kick()


def _future_list(key: str, kind: type, finished=None) -> property:
    """A future's attribute holding a list of `kind` made on first use (in its slot `key`);
    `finished`, if given, instead of one made for a future already finished."""

    def get(self):
        v = getattr(self, key)
        if v is None:
            if finished is not None and self._state == _FINISHED:
                return finished
            v = kind()
            v._future = self
            self.__setattr__(key, v)
        return v

    def put(self, v):
        v = kind(v)
        v._future = self
        self.__setattr__(key, v)

    return property(get, put)


class _Final:
    """The condition of a future that finished before anything asked for one.

    A finished future changes no more: its condition guards nothing, and the waiters that
    `wait` and `as_completed` install on it are never notified (they only count the pending
    futures). A `threading.Condition` per future is what those functions cost most over a
    batch — made and kept for each of thousands of futures, with the garbage collector's
    passes over them, it took several times their own bookkeeping. So such a future shares
    this one, which holds no lock (`wait` returns at once: a finished future's waiter has
    nothing to wait for), and `_NO_WAITERS`, which keeps no waiter."""

    __slots__ = ()

    def acquire(self, blocking=True, timeout=-1) -> bool:
        return True

    __enter__ = acquire

    def release(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass

    def _is_owned(self) -> bool:
        return True

    def wait(self, timeout=None) -> bool:
        return True

    def wait_for(self, predicate, timeout=None):
        return predicate()

    def notify(self, n=1) -> None:
        pass

    def notify_all(self) -> None:
        pass

    notifyAll = notify_all


class _NoWaiters(list):
    """The waiters of a future that finished before anything asked for them: always empty
    (see `_Final`)."""

    __slots__ = ()

    def append(self, waiter) -> None:
        pass

    def remove(self, waiter) -> None:
        pass

    def extend(self, waiters) -> None:
        pass

    def insert(self, i, waiter) -> None:
        pass

    def __iadd__(self, waiters):
        return self

    def __setitem__(self, i, v) -> None:
        pass


_FINAL = _Final()
_NO_WAITERS = _NoWaiters()


def _look_for(task) -> None:
    """Spins up to `_WATCH_SPIN` for `task` to finish. One that finds it still running stops
    the next looks for `_WATCH_PAUSE` (`wait`/`as_completed` over thousands of queued tasks
    would otherwise spend `_WATCH_SPIN` on each)."""
    global _watch_again
    end = time.perf_counter() + _WATCH_SPIN
    while not task.done() and time.perf_counter() < end:
        pass
    if not task.done():
        _watch_again = time.perf_counter() + _WATCH_PAUSE


class _MizuFuture(Future):
    """A real `Future`; `result()` collects the task in the calling thread (GIL released while
    it waits) instead of waiting for the collector thread to be scheduled.

    Made without `Future.__init__` (`_native.new_future`): its fields are slots, set when it is
    made, which the native code reads and writes at their place in the object; its condition
    and lists are made on first use — most futures are settled by the thread that waits on
    them and never need them, and one already finished when asked for them shares `_FINAL`
    and `_NO_WAITERS` instead. A future with a condition changes state
    under it, as in the base class; one without changes state under the lock its condition
    would be made under (`_finish`), so the two never cross. Whoever of the caller, a waiter,
    the collector thread and a breaking executor settles it first notifies, once.

    A future is made untracked by the garbage collector: a pipelined loop keeps thousands,
    which refer to nothing that could refer back to them until something is stored in them,
    and every collection meanwhile would walk them all. Storing anything but the value of the
    native `result()` (which tracks the future when that value is tracked) goes through
    `__setattr__` here, which tracks it again, so that cycles through a future (a
    done-callback's closure, an exception's traceback) are collected.
    """

    # (The condition and the lists are None until used.)
    __slots__ = ("_state", "_result", "_exception", "_task", "_cond",
                 "_waiter_list", "_callback_list")
    _owner = None  # the executor's `_State`

    def __setattr__(self, name, value):
        _track(self)
        object.__setattr__(self, name, value)

    @property
    def _condition(self):
        c = self._cond
        if c is not None:  # (made by the code below, which tracked the future)
            return c
        # Someone other than `result()` is about to wait on this future (`wait`,
        # `as_completed`, a done-callback, asyncio). A short task's outcome arrives within
        # microseconds: look for it first (as `result()` does), so that such a caller
        # finds the future finished instead of waiting at all.
        task = self._task
        if self._state == _PENDING and task is not None:
            if time.perf_counter() >= _watch_again and _running_loop() is None:
                _look_for(task)
            # A value natively (most outcomes); anything else through `_settle`.
            if task.done() and not _settle_done(self):
                outcome = task._outcome(0.0)
                # (A cancelled task settles through `cancel()`, which needs the condition.)
                if outcome is not None and not isinstance(outcome[1], CancelledError):
                    self._settle(outcome)
        if self._state == _FINISHED:
            # Final: nothing is left to guard (see `_Final`).
            return _FINAL
        _track(self)
        with _MADE:
            c = self._cond
            if c is None:
                c = threading.Condition()
                _store(self, "_cond", c)
        return c

    # (A finished future notifies no waiter again: see `_Final`.)
    _waiters = _future_list("_waiter_list", _WaiterList, finished=_NO_WAITERS)
    _done_callbacks = _future_list("_callback_list", _CallbackList)

    def _settle(self, outcome) -> None:
        """Completes the future with the task's outcome (the caller and the collector thread
        may both do it, with the same outcome)."""
        if outcome is None or self._state != _PENDING:
            return
        ok, value = outcome
        if not ok:
            if isinstance(value, CancelledError):
                self._owner.pending.discard(self)
                self.cancel()
                return
            if isinstance(value, (WorkerDiedError, InitializerError)):
                self._finish(ok, value)
                self._owner.breaks(value)
                return
        self._finish(ok, value)

    def _settle_if_done(self) -> bool:
        """Settles the future if its task is done; whether it was."""
        task = self._task
        if task.done():
            self._settle(task._outcome(0.0))
            return True
        return False

    def _settle_unobserved(self) -> None:
        """Settles a future nobody else refers to whose task failed (the pending set lets go
        of it so): its failure still breaks the executor where it would if observed."""
        task = self._task
        if self._state == _PENDING and task is not None and task.done():
            self._settle(task._outcome(0.0))

    def _finish(self, ok: bool, value) -> None:
        """What `set_result`/`set_exception` do. With a condition, the state changes under it,
        as in the base class: a waiter installed under it (`wait`, `as_completed`) finds the
        future either still pending, and is notified, or finished, and is not — never both.
        Without one, the state changes under `_MADE`, the lock `_condition` makes one under,
        so that whoever makes it later finds the future finished."""
        c = self._cond
        if c is None:
            with _MADE:
                if self._cond is None:
                    self._complete(ok, value)
                    return
            c = self._cond
        # (The condition's lock methods rather than `with c:`, whose enter and exit are two
        # calls of Python code: this is the path of every outcome handed to asyncio, to a
        # done-callback or to `as_completed`.)
        c.acquire()
        try:
            if not self._complete(ok, value):
                return
            for waiter in self._waiter_list or ():
                if ok:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            # (Most conditions were made for a done-callback, and no thread waits on them.)
            if c._waiters:
                c.notify_all()
        finally:
            c.release()
        if self._callback_list:
            self._invoke_callbacks()

    def _complete(self, ok: bool, value) -> bool:
        """Stores the outcome of a pending future; whether it was pending. (Tracked once for
        the stores, as `__setattr__` would on each.)"""
        if self._state != _PENDING:
            return False
        self._owner.pending.discard(self)
        _track(self)
        _store(self, "_result" if ok else "_exception", value)
        _store(self, "_state", _FINISHED)
        return True

    def _outcome(self, timeout):
        """The task's outcome; None when the future was settled meanwhile (the executor
        broke); `TimeoutError` after `timeout` seconds."""
        outcome = self._task._outcome(_SLICE if timeout is None or timeout > _SLICE else timeout)
        if outcome is None:
            return self._wait_on(timeout)
        return outcome

    def _wait_on(self, timeout):
        """`_outcome` after its first slice: once per slice, looks whether a worker died."""
        if timeout is not None and timeout <= _SLICE:
            raise TimeoutError()
        end = None if timeout is None else time.monotonic() + timeout - _SLICE
        owner = self._owner
        while self._state == _PENDING:
            owner.look_for_deaths()
            if self._state != _PENDING:
                break
            left = _SLICE if end is None else min(_SLICE, end - time.monotonic())
            if left <= 0:
                raise TimeoutError()
            outcome = self._task._outcome(left)
            if outcome is not None:
                return outcome
        return None

    def _result_py(self, timeout=None):
        """`result()`: the native `result` (installed below) takes the common case, a task
        that returned a value to the thread waiting on it, and hands every other one here."""
        if self._state == _PENDING:
            # `_outcome`, inline: the round trip's hot path.
            outcome = self._task._outcome(_SLICE if timeout is None or timeout > _SLICE else timeout)
            if outcome is None:
                outcome = self._wait_on(timeout)
            self._settle(outcome)
        if self._state == _FINISHED and self._exception is None:
            return self._result
        return super().result(0)

    def exception(self, timeout=None):
        state = self._state
        if state == _FINISHED:  # (final: no lock needed to read what it stored)
            return self._exception
        if state == _PENDING:
            self._settle(self._outcome(timeout))
        return super().exception(0)

    def cancelled(self) -> bool:
        # (One read of the state, as under the base class's lock.)
        return self._state in _CANCELLED

    def running(self) -> bool:
        # A worker has taken the task (ProcessPoolExecutor says so once a task is handed to
        # its workers' queue).
        if self._state == _PENDING:
            task = self._task
            return task is not None and task.running()
        return self._state == "RUNNING"

    def __repr__(self) -> str:
        # (The base class names the state it stores, and a task a worker runs is pending in it.)
        if self._state == _PENDING and self.running() and not self.done():
            return f"<{type(self).__name__} at {id(self):#x} state=running>"
        return super().__repr__()

    def done(self) -> bool:
        if self._state == _PENDING and self._task.done() and not _settle_done(self):
            self._settle(self._task._outcome(0.0))
        return self._state != _PENDING

    def add_done_callback(self, fn) -> None:
        # (The base class's, except that `wrap_future`'s callback added to a finished future
        # in its loop's thread queues its hand-over without a wake-up write.)
        with self._condition:
            if self._state != _FINISHED and self._state not in _CANCELLED:
                self._done_callbacks.append(fn)
                return
        if hand_over_soon(self, fn):
            return
        try:
            fn(self)
        except Exception:
            _LOGGER.exception("exception calling callback for %r", self)

    def cancel(self) -> bool:
        with self._condition:
            if self._state == _PENDING and not self._task.cancel():
                return False
        self._owner.pending.discard(self)
        if not super().cancel():
            return False
        # The task will never run: what ProcessPoolExecutor does when it drops a cancelled
        # work item, so that `wait` and `as_completed` count the future as done.
        if self._state == "CANCELLED":
            self.set_running_or_notify_cancel()
        return True


_native.install_future_result(_MizuFuture)
_new_future = _native.new_future


def _has_callbacks(fut) -> bool:
    return fut._cond is not None and bool(fut._callback_list)


def _settle_finished(futures) -> bool:
    """Settles those of `futures` whose task is done; whether there was one."""
    settled = False
    for fut in futures:
        settled |= fut._settle_if_done()
    return settled
