"""Awaiting tasks in an event loop: the loop's own watch over its tasks (`watch_in_loop`), the
thread that watches for loops that cannot (`_Watcher`), and handing a finished future's
outcome to `asyncio.wrap_future` without a wake-up round (`hand_over_soon`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _native

Task = _native.Task


class _Watcher:
    """The thread that acts when watched tasks finish — wakes the asyncio futures of
    coroutines awaiting them, runs their done-callbacks; it ends once nothing has been
    watched for a while (the next watch starts a new one)."""

    def __init__(self):
        self._lock = threading.Lock()
        # Added since the thread last looked (it keeps the rest itself).
        self._items: list[tuple[Task, Callable[[], None]]] = []
        # Set when items are added: wakes the thread also while it waits for tasks.
        self._kick = _native.Signal()
        self._thread = threading.Thread(target=self._run, name="pymizu-await", daemon=True)
        self._thread.start()

    def watch(self, task: Task, done: Callable[[], None]) -> None:
        with self._lock:
            self._items.append((task, done))
        self._kick.set()

    def _run(self) -> None:
        global _watcher
        watching: list[tuple[Task, Callable[[], None]]] = []
        while True:
            self._kick.clear()
            with self._lock:
                new, self._items = self._items, []
            watching += new
            if not watching:
                if self._kick.wait([], 0.5) is None:
                    with _watcher_lock, self._lock:
                        if not self._items:
                            _watcher = None
                            return
                continue
            ready, rest = [], []
            for it in watching:
                (ready if it[0].done() else rest).append(it)
            watching = rest
            for _, done in ready:
                try:
                    done()
                except Exception:  # (a callback's own are logged where it runs)
                    pass
            del ready
            if watching:
                # Until one finishes or more are added (a dead worker's tasks fail within a
                # slice).
                self._kick.wait([t for t, _ in watching], 0.05)


def watch_task(task: Task, done: Callable[[], None]) -> None:
    """Has `done()` called in the watcher thread once `task` is done."""
    global _watcher
    with _watcher_lock:
        if _watcher is None:
            _watcher = _Watcher()
        _watcher.watch(task, done)


_watcher: _Watcher | None = None
# Seconds `await task` looks for the outcome itself before waiting in the event loop.
_AWAIT_SPIN = 20e-6
_watcher_lock = threading.Lock()


class _LoopWatch:
    """Looks for outcomes once per round of an event loop, while a CPU is free for it (the
    native `Watch`): a loop asleep in its selector needs another thread to wake it after the
    worker finishes, and each such wake-up costs tens of microseconds in a VM. A round of the
    loop still runs its other callbacks and I/O; the watch ends when a worker has taken the
    CPU back for a moment (200 µs), after a few milliseconds, or when nothing it watches is
    pending. Whatever is still pending then goes to `handover` (a thread that waits
    natively). One watch at a time per process."""

    __slots__ = ("loop", "watch", "items", "handed")

    def __init__(self, loop, watch):
        self.loop = loop
        self.watch = watch
        # (task, run when it is done, run if the watch ends first)
        self.items: list = []
        # The last round handed every outcome on (see `__call__`).
        self.handed = False

    def __call__(self) -> None:
        if self.handed:
            # The round after the last watched outcome was handed on: its coroutine, resumed
            # before this round, may have submitted another task, which keeps the loop's
            # watch, anew (a watch's time counts from its first task); else the watch ends.
            # (Its end was not between the outcome and the coroutine.)
            self.handed = False
            if not self.items or not self._renew():
                self._end()
                return
        items, self.items = self.items, []
        looked = 0
        go_on = acted = False
        try:
            for it in items:
                looked += 1
                if it[0].done():
                    acted = True
                    it[1]()
                else:
                    self.items.append(it)
            go_on = self.watch.go_on() if self.items else acted
            self.handed = acted and not self.items
        finally:
            # (Also when a done action raised: what was not looked at yet is handed over.)
            if go_on:
                self.loop.call_soon(self)
            else:
                self.items += items[looked:]
                self._end()

    def _renew(self) -> bool:
        """A fresh watch for the items, if one is to be had."""
        self.watch.close()
        w = self.items[0][0]._watch()
        if w is None:
            return False
        self.watch = w
        return True

    def _end(self) -> None:
        global _loop_watch
        with _loop_watch_lock:
            if _loop_watch is self:
                _loop_watch = None
            self.watch.close()
            items, self.items = self.items, []
        for it in items:
            it[2]()


def _code_named(code, name: str):
    """The code object of the function `name` defined in `code`'s function (None if none)."""
    return next((c for c in code.co_consts if getattr(c, "co_name", None) == name), None)


def _chain():
    """How pymizu knows `wrap_future`'s done-callback (`_chain_future`'s `_call_set_state`),
    read once from asyncio: for the native settling in a loop (`_native.settle_watched`), its
    code, where its closure holds the asyncio future and that future's loop, and the asyncio
    future type; for `hand_over_soon`, where it holds its hand-over (`_set_state`). None if
    this asyncio's differs."""
    code = _code_named(asyncio.futures._chain_future.__code__, "_call_set_state")
    names = getattr(code, "co_freevars", ())
    if not {"destination", "dest_loop", "_set_state"} <= set(names):
        return None
    at = names.index
    return (code, at("destination"), at("dest_loop"), asyncio.Future), at("_set_state")


_CHAIN, _SET_STATE_CELL = _chain() or (None, None)


def hand_over_soon(fut, fn) -> bool:
    """For a done-callback added to the finished future `fut`: if `fn` is a `wrap_future`
    callback of the event loop running in this thread, queues its hand-over of the outcome
    with `call_soon` — what `fn` would queue with `call_soon_threadsafe`, less that one's
    wake-up write (a system call, and another to read it back), needless in the loop's own
    thread — and says so."""
    if _CHAIN is None or getattr(fn, "__code__", None) is not _CHAIN[0]:
        return False
    cells = fn.__closure__
    loop = cells[_CHAIN[2]].cell_contents
    if loop is not asyncio._get_running_loop():
        return False
    loop.call_soon(cells[_SET_STATE_CELL].cell_contents, cells[_CHAIN[1]].cell_contents, fut)
    return True


_loop_watch: _LoopWatch | None = None
_loop_watch_lock = threading.Lock()


def watch_in_loop(task: Task, done: Callable[[], None], handover: Callable[[], None]) -> bool:
    """Has the running event loop of this thread look for `task` (see `_LoopWatch`); False
    when there is no loop or no watch to be had."""
    global _loop_watch
    loop = asyncio._get_running_loop()
    if loop is None:
        return False
    stale = []
    with _loop_watch_lock:
        lw = _loop_watch
        if lw is not None and lw.loop is loop:
            lw.items.append((task, done, handover))
            return True
        if lw is not None and lw.loop.is_closed():
            # Its loop closed between two looks: what it watched goes to the waiting threads.
            stale, lw.items = lw.items, []
            lw.watch.close()
            _loop_watch = None
        w = task._watch()
        if w is not None:
            lw = _loop_watch = _LoopWatch(loop, w)
            lw.items.append((task, done, handover))
    for it in stale:
        it[2]()
    if w is None:
        return False
    loop.call_soon(lw)
    return True


def _await_task(task: Task):
    """`Task.__await__`: waits in the event loop, which looks for the outcome itself while a
    CPU is free for it, else the watcher thread wakes it."""
    if not task.done():
        # A short task's outcome arrives within microseconds: look for it (GIL held, the
        # loop blocked for at most this long) before waiting in the loop.
        end = time.perf_counter() + _AWAIT_SPIN
        while not task.done() and time.perf_counter() < end:
            pass
    if not task.done():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def to_watcher():
            watch_task(task, lambda: _wake_soon(loop, fut))

        if not watch_in_loop(task, lambda: _wake(fut), to_watcher):
            to_watcher()
        yield from fut.__await__()
    return task.result(0.0)


def _wake(fut) -> None:
    if not fut.done():
        fut.set_result(None)


def _wake_soon(loop, fut) -> None:
    try:
        loop.call_soon_threadsafe(_wake, fut)
    except RuntimeError:  # the loop is closed
        pass
