"""`Pool` and `Task`: pymizu's own API (the executor in `_executor.py` is built on it)."""

from __future__ import annotations

import atexit
import multiprocessing
import operator
import os
import pickle
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator

from . import _codec, _main, _native, _rng, _share, _xlang
from ._batches import chunk_call, chunk_of, items_len, map_items
from ._errors import MizuError, TaskError
from ._mp_calls import MultiprocessingCalls

from .wire import Call

_fn_ref = _codec.fn_ref


Task = _native.Task


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

    @property
    def shown(self) -> bool:
        return self._bar is not None or self._plain

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

    def _submit_raw(self, data, bufs, head=None) -> Task:
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
        return self._submit_raw(*_codec.dumps_call(fn, args, kwargs))

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

        `chunksize` elements travel per task (default: the runtime's chunks, in rounds of one per
        worker that shrink towards the end, so that the workers finish together);
        `timeout` bounds the whole map (`TimeoutError`); with `seed=`, element `i` runs with
        `current_rng()` over the stream `(seed, offset + i)`, so results never depend on the
        worker count or chunking; `progress=True` (or a label) shows a bar on stderr. The
        first failing element's exception is raised, with `exc._pymizu_index` set to its
        position; the rest of the map is cancelled.
        """
        if not iterables:
            raise TypeError("map() needs at least one iterable")
        items, star = map_items(iterables, self._language == "python")
        out: list = []
        for part in self._imap(fn, items, star, chunksize, timeout, seed, offset, progress, parts=True):
            out += part
        return out

    def starmap(self, fn: Callable, iterable: Iterable[tuple], **kw) -> list:
        """`[fn(*args) for args in iterable]`; keywords as for `map`."""
        items = [tuple(a) for a in iterable]
        if self._language == "python":
            items = _share.share_repeated(items, True)
        out: list = []
        for part in self._imap(fn, items, True, **_map_kw(kw), parts=True):
            out += part
        return out

    def imap(self, fn: Callable, *iterables: Iterable, **kw) -> Iterator:
        """Like `map`, but yields results in order as they arrive."""
        if not iterables:
            raise TypeError("imap() needs at least one iterable")
        return self._imap(fn, *map_items(iterables, self._language == "python"), **_map_kw(kw))

    def imap_unordered(self, fn: Callable, *iterables: Iterable, **kw) -> Iterator:
        """Like `imap`, but yields each chunk's results as soon as that chunk is done, chunks
        in the order they finish (as `multiprocessing.Pool.imap_unordered`)."""
        if not iterables:
            raise TypeError("imap_unordered() needs at least one iterable")
        return self._imap(fn, *map_items(iterables, self._language == "python"), ordered=False, **_map_kw(kw))

    def _imap(self, fn, items, star, chunksize=None, timeout=None, seed=None, offset=0, progress=False,
              ordered=True, parts=False):
        """The results of a map of `items` (as `map_items` makes them) one by one — or, with
        `parts`, a list per chunk."""
        seed = _rng.check_seed(seed)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        n = items_len(items)
        if chunksize is not None and (not isinstance(chunksize, int) or chunksize < 1):
            raise ValueError(f"chunksize must be a positive int, got {chunksize!r}")
        if self._language != "python":
            size = chunksize or max(1, -(-n // (4 * max(1, self._workers))))
            return self._ximap(fn, items, star, size, timeout, seed, offset, progress, parts)
        deadline = None if timeout is None else time.monotonic() + timeout
        # A large argument the function binds goes once, shared.
        fn = _share.share_fn(fn)
        # The runtime's chunks: rounds of one per worker, shrinking towards the end.
        plan = _native.chunk_plan(n, self._workers, chunksize)

        ref = _codec.fn_ref(fn)

        def call(s, k):
            return chunk_call(fn, ref, s, chunk_of(items, s, k), star, seed, offset)

        # Submitted now (as multiprocessing's imap does), collected as the caller iterates;
        # each chunk goes as soon as it is pickled (pickling is ~0.5 us an element here: a
        # worker would wait milliseconds for a map's whole pickling).
        tasks = []
        for c in plan:
            tasks += self._submit_all([call(*c)])
        stream = self._stream if ordered else self._stream_unordered
        bar = _Progress(n, progress)
        chunks = stream(tasks, deadline, timeout, bar, [k for _, k in plan], not parts or bar.shown)
        # A streamed map's elements are handed out natively, not by a generator.
        return chunks if parts else _native.Elements(chunks)

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

    def _ximap(self, fn, items, star, chunksize, timeout, seed, offset, progress, parts):
        call = self._xcall(fn, (), {})
        deadline = None if timeout is None else time.monotonic() + timeout
        tasks = self._pool.submit_xmap(call, items, star, seed, offset, chunksize)
        bar = _Progress(len(items), progress)
        chunks = self._xstream(tasks, deadline, timeout, bar, chunksize, offset, not parts or bar.shown)
        return chunks if parts else _native.Elements(chunks)

    def _xstream(self, tasks, deadline, timeout, bar, chunksize, offset, streamed):
        """The result lists of an R map's chunks, in order (see `_stream`)."""
        try:
            for k, t in enumerate(tasks):
                if not t.done():
                    _native.wait_ahead(tasks[k:], _left(deadline, timeout), streamed)
                try:
                    part = t.result(_left(deadline, timeout))
                except TaskError as e:
                    # The failing element's position (the chunk's start when its call
                    # could not run at all).
                    at = getattr(e, "_pymizu_element", None)
                    e._pymizu_index = k * chunksize if at is None else at - offset  # type: ignore[attr-defined]
                    raise
                yield part
                bar.update(len(part))
        finally:
            for t in tasks:
                t.cancel()
            bar.close()

    def _stream_unordered(self, tasks: list[Task], deadline, timeout, bar, lengths, streamed=True):
        """The result lists of a map's chunks as they finish (always streamed)."""
        pending = list(tasks)
        try:
            while pending:
                done = [t for t in pending if t.done()]
                if not done:
                    # The runtime may let a finished chunk wait a little to wake this thread
                    # less often (`wait_ahead`).
                    _native.wait_ahead(pending, _left(deadline, timeout), True, True)
                    continue
                for t in done:
                    pending.remove(t)
                    chunk = t.result()
                    yield chunk
                    bar.update(len(chunk))
        finally:
            for t in pending:
                t.cancel()
            bar.close()

    def _stream(self, tasks: list[Task], deadline, timeout, bar, lengths, streamed):
        """The result lists of a map's chunks, in order. The runtime decides how long to
        sleep (`wait_ahead`): a map that returns a list wants every result at once (not
        `streamed`); the rest stream them. (A final task needs no wait: `done()` here only
        spares converting the rest of the list.)"""
        try:
            for i, (t, k) in enumerate(zip(tasks, lengths)):
                if not t.done():
                    # (Past the deadline, the `result` below raises the TimeoutError.)
                    _native.wait_ahead(tasks[i:], _left(deadline, timeout), streamed)
                yield t.result(_left(deadline, timeout))
                bar.update(k)
        finally:
            for t in tasks:
                t.cancel()
            bar.close()


def _left(deadline, timeout):
    """Seconds left of a map's `timeout` (None without one); `TimeoutError` once none are."""
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise TimeoutError(f"the map did not finish within {timeout} s")
    return left


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
    main_path, main_module = _main.where()
    init = None
    if initializer is not None:
        if not callable(initializer):
            raise TypeError("initializer must be callable")
        init, _ = _codec.dumps_sharing((initializer, tuple(initargs)), inherit=True)
    state = {
        "sys_path": list(sys.path),
        "sys_argv": list(sys.argv),
        "main_path": main_path,
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


# The pools of this process not stopped yet. Python does not promise to drop what a script's
# globals hold when it exits (a `__main__` whose dict is in a reference cycle outlives the last
# garbage collection), so a pool kept in a global is stopped here: its workers are gone, and
# nothing of it is left in shared memory, by the time the interpreter has exited.
_live: "weakref.WeakSet[Pool]" = weakref.WeakSet()


@atexit.register
def _stop_at_exit() -> None:
    for pool in list(_live):
        if pool._made_in == _forks:
            Pool.stop(pool)


class Pool(MultiprocessingCalls, _Submitter):
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
        _start: int | None = None,
    ):
        # `_start`: workers started now, the rest (up to `workers`) as tasks in flight need
        # them (PoolExecutor's on-demand start); None starts all of them now.
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
        try:
            n_slots = operator.index(slots)
        except TypeError:
            n_slots = 0
        if not 1 <= n_slots <= _native.MAX_SLOTS:
            raise ValueError(f"slots must be an int in 1..={_native.MAX_SLOTS}, got {slots!r}")
        slots = n_slots
        if language == "r":
            if initializer is not None or initargs:
                raise ValueError("an R pool has no Python initializer (run R code with pymizu.call(source=...))")
            self._start_file = None
            program, args = _r_worker_command(max_tasks_per_child)
            self._pool = _native.Pool(workers, program, args, exec_timeout, slots)
            _live.add(self)
            self._language = language
            self._workers = workers
            self.submit = self._xsubmit
            return
        args, self._start_file = _worker_args(workers, initializer, initargs, max_tasks_per_child)
        try:
            self._pool = _native.Pool(workers, sys.executable, args, exec_timeout, slots, start=_start)
        except BaseException:
            os.unlink(self._start_file)
            raise
        _live.add(self)
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
        """The number of workers the pool keeps running (a `PoolExecutor`'s: at most, as work
        needs them)."""
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

