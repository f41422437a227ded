"""What lets a pool's `Task` be waited on as a `concurrent.futures` future: `wait`,
`as_completed` (also over tasks mixed with other futures) and done-callbacks.

Those functions read a future's `_state`, take its `_condition` and install a waiter in its
`_waiters`, and the future notifies its waiters when it finishes. A task finishes in a
worker, where nothing of this process runs, so here a thread of this process that finds a
task done notifies for it (`notify_done`): a thread blocked in `wait` or `as_completed` (its
waiter's event, `_WaiterEvent`, which `PoolExecutor` futures use too, parks on the tasks),
the thread that cancels a task, or, for done-callbacks, the thread that wakes awaiting
coroutines (`_loops._Watcher`). A task counts as finished to those functions once it has been
so notified (its `_state`), and every task's condition is one lock (`_LOCK`), under which
notifying happens: the state they read under it cannot change before they have installed
their waiter, so a waiter is notified of a task exactly when it counted the task as pending. (Taking a task's condition notifies for it
first when it is done: a task finished before anyone waits takes no waiter, as a standard
future finished before does not.)
"""

from __future__ import annotations

import threading
import time
from concurrent.futures._base import LOGGER as _LOGGER

from . import _native
from ._loops import watch_task

_LOCK = threading.RLock()
# Tasks with waiters installed and not notified yet, and those waiters.
_waiters: dict = {}
# Tasks with done-callbacks not run yet, and those callbacks (in the order added).
_callbacks: dict = {}
_PENDING = "PENDING"


class _WaiterEvent:
    """The event of a `concurrent.futures` waiter (what `wait` and `as_completed` block on)
    installed on a pymizu future or pool task, in place of its `threading.Event`.

    With the standard event, the thread that settles the future and sets the event is the
    executor's collector, which must be woken first: two thread wake-ups after the worker
    finishes. A thread waiting here parks where the pool's outcomes wake it, as `result()`
    does, and settles the finished future itself: one wake-up. Any other `set()` (a future of
    another kind finishing, a cancellation, a broken executor) wakes it there too.
    """

    __slots__ = ("_signal", "_futures", "_tasks", "set", "clear", "is_set")

    def __init__(self, was_set: bool):
        sig = self._signal = _native.Signal()
        self.set, self.clear, self.is_set = sig.set, sig.clear, sig.is_set
        # The PoolExecutor futures and the pool tasks the waiter is installed on.
        self._futures = []
        self._tasks = []
        if was_set:
            sig.set()

    def wait(self, timeout=None) -> bool:
        sig = self._signal
        end = None if timeout is None else time.monotonic() + timeout
        while not sig.is_set():
            pending = [f for f in self._futures if f._state == _PENDING]
            tasks = self._tasks
            if tasks:
                tasks = self._tasks = [t for t in tasks if t._state == _PENDING]
            left = None if end is None else max(0.0, end - time.monotonic())
            i = sig.wait([f._task for f in pending] + tasks, left)
            if i is None:
                break
            if i >= 0:
                # Settling notifies the waiter, which sets this event if it is done. Every
                # future whose task is done goes at once: a waiter on thousands (`as_completed`
                # of a large batch) is not woken once per future.
                for f in pending:
                    f._settle_if_done()
                if tasks:
                    notify_done(tasks)
        return sig.is_set()


class _Waiters:
    """`Task._waiters`: what `wait` and `as_completed` add their waiter to and remove it
    from (under `_LOCK`)."""

    __slots__ = ("_task",)

    def __init__(self, task):
        self._task = task

    def append(self, waiter) -> None:
        task = self._task
        if task._state != _PENDING:
            # Counted as finished when it was installed: nothing to tell it.
            return
        ev = waiter.event
        if type(ev) is not _WaiterEvent:
            ev = waiter.event = _WaiterEvent(ev.is_set())
        ev._tasks.append(task)
        _waiters.setdefault(task, []).append(waiter)

    def remove(self, waiter) -> None:
        task = self._task
        ws = _waiters.get(task)
        if ws is None:
            return  # (notified: the list went with it)
        try:
            ws.remove(waiter)
        except ValueError:
            return
        if not ws:
            del _waiters[task]

    def __len__(self) -> int:
        return len(_waiters.get(self._task, ()))


def notify_done(tasks) -> None:
    """Notifies the waiters and runs the done-callbacks of those of `tasks` that are done."""
    run = []
    with _LOCK:
        for task in tasks:
            if not task.done():
                continue
            if task._cf_notify():
                ws = _waiters.pop(task, None)
                if ws:
                    _tell(task, ws)
            fns = _callbacks.pop(task, None)
            if fns:
                run.append((task, fns))
    for task, fns in run:
        for fn in fns:
            _call(fn, task)


def _tell(task, ws) -> None:
    if task.cancelled():
        for w in ws:
            w.add_cancelled(task)
        return
    outcome = task._outcome(0.0)
    ok = outcome is None or outcome[0]
    for w in ws:
        if ok:
            w.add_result(task)
        else:
            w.add_exception(task)


def _call(fn, task) -> None:
    try:
        fn(task)
    except Exception:
        _LOGGER.exception("exception calling callback for %r", task)


def add_done_callback(task, fn) -> None:
    """`Task.add_done_callback`: `fn(task)` once the task is done — at once, in this thread,
    when it is; else in the thread that wakes awaiting coroutines, or in the thread that
    cancels it."""
    if task.done():
        # (Callbacks added before it run first, as they would have.)
        notify_done((task,))
        _call(fn, task)
        return
    with _LOCK:
        _callbacks.setdefault(task, []).append(fn)
    watch_task(task, lambda: notify_done((task,)))


def cancelled(task) -> None:
    """Called by `Task.cancel()` when it cancelled the task: what the standard future does
    then — its waiters are notified and its callbacks run, in this thread."""
    if task in _waiters or task in _callbacks:
        notify_done((task,))
