"""`Pool` and `Task`: pymizu's own API (the executor in `_executor.py` is built on it)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import _codec, _native, _rng, _share, _xlang
from ._errors import (
    CancelledError,
    ExecTimeoutError,
    MizuError,
    PayloadError,
    RemoteTraceback,
    StoppedError,
    TaskError,
    WorkerDiedError,
)

from .wire import Call

_MAX_SLOT = 2**64 - 1 if sys.maxsize > 2**32 else 2**32 - 1
_fn_ref = _codec.fn_ref


def decode(status: int, data, bufs, slot: int, pid: int) -> tuple[bool, Any]:
    """(is_result, value-or-exception) from a native outcome (called by `Task`): status 0 a
    pickled result, 1 a pickled exception and traceback, 2 worker died, 3 execution timeout,
    4 cancelled, 5 pool stopped."""
    if status == 0:
        try:
            return True, _codec.loads(data, buffers=bufs)
        except BaseException as e:  # unpickling runs arbitrary code, even `sys.exit()`
            if isinstance(e, KeyboardInterrupt):
                raise
            err = PayloadError(f"the task's result could not be unpickled: {e!r}")
            err.__cause__ = e
            return False, err
    if status == 1:
        if slot == _MAX_SLOT:  # the runtime's own text, not a pickled exception
            return False, TaskError("RemoteError", bytes(data).decode("utf-8", "replace"))
        try:
            exc, tb = _codec.loads(data, buffers=bufs)
        except BaseException as e:  # as for a result
            if isinstance(e, KeyboardInterrupt):
                raise
            err = PayloadError(f"the task's exception could not be unpickled: {e!r}")
            err.__cause__ = e
            return False, err
        if tb:
            exc.__cause__ = RemoteTraceback(tb)
        return False, exc
    if status == 2:
        return False, WorkerDiedError(slot, pid)
    if status == 3:
        return False, ExecTimeoutError(slot, pid)
    if status == 4:
        return False, CancelledError()
    return False, StoppedError("the pool stopped before the task ran")


Task = _native.Task


class _Watcher:
    """The thread that wakes asyncio futures when their tasks finish; it ends once nothing
    has been awaited for a while (the next `await` starts a new one)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._items: list[tuple[Task, Any, Any]] = []
        self._kick = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pymizu-await", daemon=True)
        self._thread.start()

    def watch(self, task: Task, loop, fut) -> None:
        with self._lock:
            self._items.append((task, loop, fut))
        self._kick.set()

    def _run(self) -> None:
        global _watcher
        while True:
            with self._lock:
                items = list(self._items)
            if not items:
                if not self._kick.wait(0.5):
                    with _watcher_lock, self._lock:
                        if not self._items:
                            _watcher = None
                            return
                self._kick.clear()
                continue
            pending = [t for t, _, _ in items if not t.done()]
            if pending:
                _native.wait_any(pending, 0.05)
            ready = [it for it in items if it[0].done()]
            if not ready:
                continue
            with self._lock:
                self._items = [it for it in self._items if not any(it is r for r in ready)]
            for _, loop, fut in ready:
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:  # the loop is closed
                    pass


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
    global _watcher
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
            global _watcher
            with _watcher_lock:
                if _watcher is None:
                    _watcher = _Watcher()
                _watcher.watch(task, loop, fut)

        if not watch_in_loop(task, lambda: _wake(fut), to_watcher):
            to_watcher()
        yield from fut.__await__()
    return task.result(0.0)


def _wake(fut) -> None:
    if not fut.done():
        fut.set_result(None)


def _run_chunk(fn, start: int, items: list, star: bool, seed: int | None, offset: int) -> list:
    """Runs a map chunk inside a worker; an element's exception carries its index."""
    if seed is None:
        return _native.run_calls(fn, items, star, start)
    out = []
    append = out.append
    i = start
    try:
        for x in items:
            _rng.enter(seed, offset + i)
            try:
                append(fn(*x) if star else fn(x))
            finally:
                _rng.leave()
            i += 1
    except BaseException as e:
        try:
            e._pymizu_index = i  # type: ignore[attr-defined]
        except Exception:
            pass
        raise
    return out


# (In a worker) the list the last chunk returned, until its result is pickled: a call's
# value that cannot be pickled then fails that call alone.
_batch_out = None


class _Batch(list):
    """A chunk's values when some of its calls failed; `errors` maps a call's position to its
    pickled `(exception, traceback)` (its value is None)."""

    errors: dict


def _failure(e: BaseException, tb: str) -> bytes:
    try:
        return pickle.dumps((e, tb), protocol=5)
    except Exception:
        return pickle.dumps((TaskError(type(e).__qualname__, str(e), tb), tb), protocol=5)


def _run_batch(fn, calls: list, skip) -> list:
    """Runs the calls of a chunk of `Pool.submit_batch` inside a worker (those at positions in
    `skip` were cancelled: their values are None)."""
    if not skip:
        return _batch_done(*_native.run_batch_calls(fn, calls))
    out = []
    append = out.append
    errors = None
    it = iter(calls)
    while True:
        try:
            for args in it:
                append(None if len(out) in skip else fn(*args))
            break
        except BaseException as e:  # the call's outcome, as a task's
            if errors is None:
                errors = {}
            errors[len(out)] = _failure(e, traceback.format_exc())
            append(None)
    return _batch_done(out, errors)


def _batch_done(out: list, errors: dict | None) -> list:
    """(In a worker) what a chunk returns: its values, and its calls' failures if any."""
    global _batch_out
    if errors is not None:
        out = _Batch(out)
        out.errors = errors
    _batch_out = out
    return out


def _batch_failure(e: BaseException) -> bytes:
    """(In a worker) the failure of a call of a chunk `_native.run_batch_calls` ran."""
    return _failure(e, "".join(traceback.format_exception(type(e), e, e.__traceback__)))


def _run_batch_ref(head: bytes, calls: list, skip) -> list:
    """`_run_batch` of the function pickled by reference as `head` (`_codec.fn_ref`): the
    chunk's call is then small values only, written natively."""
    return _run_batch(_codec.fn_from_ref(head), calls, skip)


def _batch_result(value):
    """(In a worker) `value`, the list a chunk returned, whose pickling failed: the values that
    cannot be pickled become their calls' failures."""
    errors = dict(getattr(value, "errors", {}))
    out = _Batch(value)
    for i, v in enumerate(value):
        if i in errors:
            continue
        try:
            _codec.dumps(v)
        except Exception as e:
            errors[i] = _failure(e, traceback.format_exc())
            out[i] = None
    out.errors = errors
    return out


def _batch_element(values: _Batch, i: int) -> tuple[bool, Any]:
    """(ok, value or exception) of call `i` of a chunk some of whose calls failed."""
    b = values.errors.get(i)
    if b is None:
        return True, values[i]
    return decode(1, b, [], 0, 0)


def _batch_payload(fn, calls: list, skip: list) -> tuple[bytes, list]:
    """The pickled call of a chunk, leaving out the calls at positions `skip` (cancelled)."""
    return _codec.dumps_call(_run_batch, (fn, calls, frozenset(skip)), {})


class _Progress:
    """A progress bar on stderr: tqdm when installed, else a plain counter line."""

    def __init__(self, total: int, enabled):
        self._bar = None
        self._plain = False
        self._done = 0
        self._total = total
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._plain = True
            self._show()
        else:
            desc = enabled if isinstance(enabled, str) else None
            self._bar = tqdm(total=total, desc=desc, file=sys.stderr)

    def _show(self) -> None:
        sys.stderr.write(f"\rpymizu: {self._done}/{self._total}")
        sys.stderr.flush()

    def update(self, n: int) -> None:
        self._done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._plain:
            self._show()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._plain:
            sys.stderr.write("\n")


class _Submitter:
    """What `Pool` and the nested pool of `current_pool()` share: the call, batch and map
    API over `_submit_raw` / `_submit_batch_raw`."""

    _workers = 1
    _language = "python"

    def _submit_raw(self, data, bufs) -> Task:
        raise NotImplementedError

    def _submit_small(self, head, args, kwargs) -> Task | None:
        raise NotImplementedError

    def _submit_all(self, calls) -> list[Task]:
        raise NotImplementedError

    def submit(self, fn: Callable, /, *args, **kwargs) -> Task:
        """Runs `fn(*args, **kwargs)` in a worker; returns its `Task`. Arguments are pickled
        here (an unpicklable one raises now); large buffers cross through shared memory.
        When every task slot holds an uncollected task, finished outcomes move into their
        `Task` objects to make room (or submission waits for a task to finish)."""
        # A call of a module-level function with small arguments (numbers, strings, short
        # containers of them) is written natively; anything else is pickled here.
        head = _fn_ref(fn)
        if head is not None:
            t = self._submit_small(head, args, kwargs)
            if t is not None:
                return t
        data, bufs = _codec.dumps_call(fn, args, kwargs)
        return self._submit_raw(data, bufs)

    def submit_batch(self, fn: Callable, argss: Iterable[tuple], chunksize: int | None = None) -> list[Task]:
        """Submits `fn(*args)` for every `args` tuple; returns one `Task` per call.

        Calls travel in chunks: a chunk is one task of the pool, whose worker runs its calls
        one after another. By default chunks shrink as the batch's end nears (at most 128
        calls, about a quarter of what is left per worker), so the workers end together;
        `chunksize=n` fixes it, and `chunksize=1` sends every call on its own (for calls that
        wait for each other, or long ones that should spread over the workers at once). Each
        task keeps its own outcome: a call's exception is that task's alone. `cancel()` of a
        task whose chunk is still queued succeeds; the other calls of the chunk go again.
        A worker that dies fails every call of the chunk it ran.
        """
        if chunksize is not None and (type(chunksize) is not int or chunksize < 1):
            raise ValueError(f"chunksize must be a positive int, got {chunksize!r}")
        if self._language != "python":
            return [self._xsubmit(fn, *a) for a in argss]
        calls = getattr(self, "_submit_calls", None)
        if calls is None:
            return self._submit_all([_codec.dumps_call(fn, tuple(a), {}) for a in argss])
        if chunksize == 1:
            return calls(fn, argss)
        return self._submit_chunks(fn, argss, chunksize, self._workers)

    def collect_any(self, tasks: list[Task], timeout: float | None = None) -> Task:
        """Waits until one of `tasks` is done and returns it (`TimeoutError` after `timeout`)."""
        if not tasks:
            raise ValueError("collect_any needs at least one task")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for t in tasks:
                if t.done():
                    return t
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no task finished within {timeout} s")
            _native.wait_any(tasks, left)

    def collect_all(self, tasks: list[Task], timeout: float | None = None) -> list:
        """The results of `tasks` in order; the first failure (by position) is raised."""
        return _native.collect_all(tasks, timeout)

    # -- maps ------------------------------------------------------------------------------

    def map(
        self,
        fn: Callable,
        *iterables: Iterable,
        chunksize: int | None = None,
        timeout: float | None = None,
        seed: int | None = None,
        offset: int = 0,
        progress=False,
    ) -> list:
        """`[fn(*xs) for xs in zip(*iterables)]` over the workers, in input order.

        `chunksize` elements travel per task (default: about four chunks per worker);
        `timeout` bounds the whole map (`TimeoutError`); with `seed=`, element `i` runs with
        `current_rng()` over the stream `(seed, offset + i)`, so results never depend on the
        worker count or chunking; `progress=True` (or a label) shows a bar on stderr. The
        first failing element's exception is raised, with `exc._pymizu_index` set to its
        position; the rest of the map is cancelled.
        """
        if not iterables:
            raise TypeError("map() needs at least one iterable")
        if len(iterables) == 1:
            return list(self._imap(fn, list(iterables[0]), False, chunksize, timeout, seed, offset, progress))
        return list(self._imap(fn, list(zip(*iterables)), True, chunksize, timeout, seed, offset, progress))

    def starmap(self, fn: Callable, iterable: Iterable[tuple], **kw) -> list:
        """`[fn(*args) for args in iterable]`; keywords as for `map`."""
        return list(self._imap(fn, [tuple(a) for a in iterable], True, **_map_kw(kw)))

    def imap(self, fn: Callable, *iterables: Iterable, **kw) -> Iterator:
        """Like `map`, but yields results in order as they arrive."""
        if not iterables:
            raise TypeError("imap() needs at least one iterable")
        if len(iterables) == 1:
            return self._imap(fn, list(iterables[0]), False, **_map_kw(kw))
        return self._imap(fn, list(zip(*iterables)), True, **_map_kw(kw))

    def _imap(self, fn, items, star, chunksize=None, timeout=None, seed=None, offset=0, progress=False):
        seed = _rng.check_seed(seed)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        n = len(items)
        if chunksize is None:
            chunksize = max(1, -(-n // (4 * max(1, self._workers))))
        elif not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"chunksize must be a positive int, got {chunksize!r}")
        if self._language != "python":
            return self._ximap(fn, items, star, chunksize, timeout, seed, offset, progress)
        deadline = None if timeout is None else time.monotonic() + timeout
        # A large argument every element (or the function) passes goes once, shared.
        fn = _share.share_fn(fn)
        items = _share.share_repeated(items, star)
        calls = [
            _codec.dumps_call(_run_chunk, (fn, s, items[s : s + chunksize], star, seed, offset), {})
            for s in range(0, n, chunksize)
        ]
        # Submitted now (as multiprocessing's imap does), collected as the caller iterates.
        return self._stream(self._submit_all(calls), deadline, timeout, _Progress(n, progress), chunksize, n)

    # -- pools of another language's workers (`Pool(language="r")`) -------------------------

    def _xcall(self, fn, args, kwargs) -> Call:
        if isinstance(fn, str):
            return _xlang.call(fn, *args, **kwargs)
        if not isinstance(fn, Call):
            raise TypeError(
                f"a pool of {self._language} workers runs pymizu.call(...) tasks "
                f"(or a function's name), not a {type(fn).__name__}"
            )
        if args or kwargs:
            if fn.source and args:
                raise TypeError("a source call takes named arguments only (they become variables)")
            return Call(fn.target, fn.source, [*fn.args, *args], {**fn.kwargs, **kwargs})
        return fn

    def _xsubmit(self, fn, /, *args, **kwargs) -> Task:
        """`submit` of a pool of another language's workers: `fn` is a `pymizu.call(...)` (or a
        function's name); `args` and `kwargs` are added to its arguments."""
        return self._pool.submit_xcall(self._xcall(fn, args, kwargs))

    def _ximap(self, fn, items, star, chunksize, timeout, seed, offset, progress):
        call = self._xcall(fn, (), {})
        deadline = None if timeout is None else time.monotonic() + timeout
        tasks = self._pool.submit_xmap(call, items, star, seed, offset, chunksize)
        return self._xstream(tasks, deadline, timeout, _Progress(len(items), progress), chunksize, offset)

    def _xstream(self, tasks, deadline, timeout, bar, chunksize, offset):
        try:
            for k, t in enumerate(tasks):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the map did not finish within {timeout} s")
                try:
                    part = t.result(left)
                except TaskError as e:
                    # The failing element's position (the chunk's start when its call
                    # could not run at all).
                    at = getattr(e, "_pymizu_element", None)
                    e._pymizu_index = k * chunksize if at is None else at - offset  # type: ignore[attr-defined]
                    raise
                yield from part
                bar.update(len(part))
        finally:
            for t in tasks:
                t.cancel()
            bar.close()

    def _stream(self, tasks: list[Task], deadline, timeout, bar, chunksize, n):
        try:
            for k, t in enumerate(tasks):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the map did not finish within {timeout} s")
                yield from t.result(left)
                bar.update(min(chunksize, n - k * chunksize))
        finally:
            for t in tasks:
                t.cancel()
            bar.close()


def _map_kw(kw: dict) -> dict:
    allowed = {"chunksize", "timeout", "seed", "offset", "progress"}
    bad = set(kw) - allowed
    if bad:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(bad))}")
    return kw


def _remove_stale_start_files() -> None:
    """Removes the start-up files of pools whose owner died without stopping them (killed):
    the pid is in the name, and a pool removes its own file when it stops."""
    d = tempfile.gettempdir()
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        if not (n.startswith("pymizu-") and n.endswith(".start")):
            continue
        pid = n.split("-")[1]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            os.unlink(os.path.join(d, n))
        except OSError:
            pass


def _worker_args(workers, initializer, initargs, max_tasks_per_child) -> tuple[list[str], str | None]:
    """The worker command line, and the file holding the start-up state (removed at stop)."""
    args = ["-m", "pymizu.worker", "--workers", str(workers)]
    if max_tasks_per_child is not None:
        if not isinstance(max_tasks_per_child, int) or max_tasks_per_child < 1:
            raise ValueError("max_tasks_per_child must be a positive int")
        args += ["--max-tasks", str(max_tasks_per_child)]
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    main_path = getattr(main, "__file__", None) if spec is None else None
    main_module = spec.name if spec is not None and spec.name != "pymizu.worker" else None
    if main_module is not None and (main_module == "__main__" or main_module.endswith(".__main__")):
        # `python -m package` (`python -m unittest`, `-m pytest`): importing the package's
        # `__main__` would run the program again in the worker; multiprocessing skips it too.
        main_module = None
    init = None
    if initializer is not None:
        if not callable(initializer):
            raise TypeError("initializer must be callable")
        init, _ = _codec.dumps_sharing((initializer, tuple(initargs)), inherit=True)
    state = {
        "sys_path": list(sys.path),
        "sys_argv": list(sys.argv),
        "main_path": os.path.abspath(main_path) if main_path else None,
        "main_module": main_module,
        "cwd": os.getcwd(),
        "init": init,
        # Workers share it, so that multiprocessing managers' proxies connect from them.
        "authkey": bytes(multiprocessing.current_process().authkey),
    }
    _remove_stale_start_files()
    fd, path = tempfile.mkstemp(prefix=f"pymizu-{os.getpid()}-", suffix=".start")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(state, f, protocol=5)
    return args + ["--start", path], path


# Forks this process's line has gone through: a pool belongs to the process that made it
# (`_made_in`), and a forked child may make and use pools of its own.
_forks = 0


_r_checked: set[str] = set()


def _r_worker_command(max_tasks_per_child) -> tuple[str, list[str]]:
    """`Rscript` and the arguments that start a worker of the mizu R package; a clear error
    when R or the package is missing."""
    import shutil
    import subprocess

    rscript = os.environ.get("MIZU_RSCRIPT") or shutil.which("Rscript")
    if not rscript:
        raise MizuError(
            "R workers need R: no Rscript on PATH (install R, e.g. `apt-get install r-base-core`, "
            "then the mizu R package; or set MIZU_RSCRIPT)"
        )
    if rscript not in _r_checked:
        probe = "if (!requireNamespace('mizu', quietly = TRUE)) quit(status = 3L)"
        try:
            r = subprocess.run(
                [rscript, "--no-save", "--no-restore", "--no-echo", "-e", probe],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MizuError(f"R workers need a working R: {rscript} failed to run ({e})") from None
        if r.returncode == 3:
            raise MizuError(
                f"R is installed ({rscript}) but the mizu R package is not: install it "
                "(`R CMD INSTALL mizu-r/pkg` in a checkout, or `cargo xtask rpkg`), or point "
                "R_LIBS at the library that has it"
            )
        if r.returncode != 0:
            raise MizuError(f"R workers need a working R: {rscript} exited with {r.returncode}: "
                            f"{r.stderr.decode(errors='replace').strip()}")
        _r_checked.add(rscript)
    max_tasks = 0 if max_tasks_per_child is None else int(max_tasks_per_child)
    return rscript, ["--no-save", "--no-restore", "--no-echo", "-e", "mizu:::.worker_main()", str(max_tasks), ""]


def _after_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_after_fork)


class Pool(_Submitter):
    """A pool of worker processes (fresh interpreters, never forks of the caller).

    `Pool(workers=None, *, initializer=None, initargs=(), max_tasks_per_child=None,
    exec_timeout=None, slots=4096, language="python")`: `workers` defaults to the usable CPU count;
    `initializer(*initargs)` runs in every worker before its first task;
    `max_tasks_per_child` replaces a worker after that many tasks; `exec_timeout` kills and
    replaces a worker whose task runs longer (the task fails with `ExecTimeoutError`);
    `slots` bounds the tasks in flight (submission waits when all are taken).
    `language="r"` starts R workers (the mizu R package, through `Rscript`) that run
    `pymizu.call(...)` tasks: `submit(pymizu.call("stats::median", x))`, `map(call, xs)`
    (each element appended to the call's arguments); values cross as `docs/interop.md` says.
    A context manager: leaving it stops the pool.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        initializer: Callable | None = None,
        initargs: tuple = (),
        max_tasks_per_child: int | None = None,
        exec_timeout: float | None = None,
        slots: int = 4096,
        language: str = "python",
    ):
        if language not in ("python", "r"):
            raise ValueError(f'language must be "python" or "r", got {language!r}')
        if os.environ.get("PYMIZU_BOOTING") == "1":
            raise MizuError(
                "a Pool was created while a worker imported the caller's script: create pools "
                'under `if __name__ == "__main__":` (workers import the script to find its functions)'
            )
        self._made_in = _forks
        if workers is None:
            workers = len(os.sched_getaffinity(0)) or 1
        if not isinstance(workers, int) or workers <= 0:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        if language == "r":
            if initializer is not None or initargs:
                raise ValueError("an R pool has no Python initializer (run R code with pymizu.call(source=...))")
            self._start_file = None
            program, args = _r_worker_command(max_tasks_per_child)
            self._pool = _native.Pool(workers, program, args, exec_timeout, slots)
            self._language = language
            self._workers = workers
            self.submit = self._xsubmit
            return
        args, self._start_file = _worker_args(workers, initializer, initargs, max_tasks_per_child)
        try:
            self._pool = _native.Pool(workers, sys.executable, args, exec_timeout, slots)
        except BaseException:
            os.unlink(self._start_file)
            raise
        self._workers = workers
        # The native methods check for a forked child themselves.
        self._submit_raw = self._pool.submit
        self._submit_small = self._pool.submit_small
        self._submit_all = self._pool.submit_batch
        self._submit_calls = self._pool.submit_calls
        self._submit_chunks = self._pool.submit_chunks
        # `submit` itself, natively (the method documents it): one call instead of three
        # Python frames on the hot path — unless a subclass overrides `submit`.
        if type(self).submit is _Submitter.submit:
            self.submit = self._pool.submit_function("task")

    def _check(self) -> None:
        if getattr(self, "_made_in", _forks) != _forks:
            raise _native.ForkedError("a pymizu Pool cannot be used in a forked child process")

    @property
    def workers(self) -> int:
        """The number of workers the pool keeps running."""
        return self._workers

    def status(self) -> dict:
        """Workers (slot, pid, state, busy, tasks run, tasks stolen), the tasks run, and this
        process's waits for outcomes: how many ended while it watched (polled without
        sleeping, a CPU being free) and how many times one slept."""
        rows = self._pool.status()
        watched, parks = self._pool.waits()
        return {
            "workers": [
                {"slot": s, "pid": p, "state": st, "busy": b, "tasks": n, "steals": k}
                for s, p, st, b, n, k in rows
            ],
            "tasks": sum(r[4] for r in rows),
            "waits": {"watched": watched, "parks": parks},
        }

    def stop(self, grace: float = 5.0) -> None:
        """Stops the pool: queued tasks are cancelled, workers get `grace` seconds to finish
        their current task, then are killed; results not collected yet are dropped; what the
        pool kept in shared memory is removed."""
        self._check()
        self._pool.stop(grace)
        if self._start_file is not None:
            try:
                os.unlink(self._start_file)
            except FileNotFoundError:
                pass
            self._start_file = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):
        if getattr(self, "_start_file", None) and getattr(self, "_made_in", None) == _forks:
            try:
                os.unlink(self._start_file)
            except OSError:
                pass


class _NestedPool(_Submitter):
    """The pool seen from inside a task (`current_pool()`): submissions and maps go to the
    same workers, and waiting for them runs other tasks, so nesting never deadlocks."""

    def __init__(self):
        self._workers = int(os.environ.get("PYMIZU_WORKERS", "1"))
        self._submit_raw = _native.nested_submit
        self._submit_small = _native.nested_submit_small
        self._submit_all = _native.nested_submit_batch


_nested = None


def current_pool() -> _Submitter:
    """The pool running the current task (inside a worker), for nested `submit`/`map`."""
    global _nested
    if not _native.in_task():
        raise MizuError("current_pool() is only available inside a pymizu task")
    if _nested is None:
        _nested = _NestedPool()
    return _nested

