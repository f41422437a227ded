"""`PoolExecutor`: the concurrent.futures drop-in."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import threading
import time
import weakref
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool

from . import _codec, _native, _share
from ._errors import CancelledError, MizuError
from ._batches import chunk_call, chunk_of, items_len, map_items
from ._futures import _has_callbacks, _MizuFuture, _new_future, _settle_finished
from ._pool import Pool


class _State:
    """What an executor's futures, its collector thread and its finalizer share — not the
    executor itself, so that an executor nobody references any more is collected, and then
    finishes its work and releases its workers as `shutdown(wait=False)` would."""

    def __init__(self, mpool: Pool):
        self.mpool = mpool
        self.pool = mpool._pool
        self.lock = threading.Lock()
        # Futures not settled yet (settling removes them): what the collector looks at.
        self.pending = _native.PendingSet()
        # Set by a kick (a future newly watched, shutdown): wakes the collector also while it
        # waits for its watched tasks.
        self.wakeup = _native.Signal()
        self.kick = self.wakeup.set
        self.closing = False
        # Neither closing nor broken: `submit`'s one check (see `accepting`).
        self._accepting = True
        # Why the executor broke (a worker died, or an initializer failed), else None.
        self.broken: str | None = None
        self.deaths = 0
        # A worker's death fails only its task (the pool replaces the worker) instead of
        # breaking the executor (`PoolExecutor(replace_dead_workers=True)`).
        self.recovers = False
        self.stopped = threading.Event()
        # Rounds the collector thread made (tests: it waits for events, it does not poll).
        self.rounds = 0
        self.collector: threading.Thread | None = None

    @property
    def accepting(self) -> bool:
        return self._accepting

    @accepting.setter
    def accepting(self, v: bool) -> None:
        # The native `submit` reads the pool's copy.
        self._accepting = v
        self.pool.set_accepting(v)

    def future_class(self) -> type:
        """This executor's future class: `_MizuFuture` with `_owner` as a class attribute (one
        store less per future)."""
        cls = type("_MizuFuture", (_MizuFuture,), {"_owner": self, "__module__": __name__,
                                                   "__qualname__": _MizuFuture.__qualname__})
        # `result` of its own: the interpreter's fast call of a native method wants the
        # method's class to be the instance's exact type.
        _native.install_future_result(cls)
        return cls

    def close(self, cancel_futures: bool = False) -> None:
        with self.lock:
            self.closing = True
            self.accepting = False
            pending = self.pending.in_order()
        if cancel_futures:
            # A ProcessPoolExecutor hands its oldest pending calls to its workers' queue,
            # where they can no longer be cancelled, as they are submitted. Here the oldest
            # pending futures, one per worker (those running, or the next to run), are left to
            # run likewise, rather than whichever a worker claimed in time; the rest are
            # cancelled, the newest first.
            for fut in reversed(pending[self.mpool.workers :]):
                fut.cancel()
        self.kick()

    def look_for_deaths(self) -> None:
        """Breaks the executor when a worker died since it started (even an idle one: what
        a ProcessPoolExecutor's manager thread does)."""
        if self.broken is None and not self.recovers and not self.stopped.is_set():
            try:
                died = self.pool.deaths() != self.deaths
            except MizuError:  # a forked child's copy
                return
            if died:
                self.breaks(BrokenProcessPool("a worker process died"))

    def breaks(self, why: BaseException) -> None:
        """Marks the executor broken: every pending future fails with `BrokenProcessPool`
        and `submit` raises it, as with ProcessPoolExecutor (a `pymizu.Pool` replaces the
        worker and serves on instead)."""
        with self.lock:
            if self.broken is not None or self.recovers:
                return
            self.accepting = False
            self.broken = (
                f"the pool is broken ({type(why).__name__}: {str(why).partition(chr(10))[0]}); "
                "pending futures failed and "
                "no more work is accepted, as with ProcessPoolExecutor"
            )
            pending = list(self.pending)
        for fut in pending:
            if fut._task.done():  # its own outcome (the task that died fails as itself)
                outcome = fut._task._outcome(0.0)
                if outcome is not None and not isinstance(outcome[1], CancelledError):
                    fut._finish(*outcome)
                    continue
            fut._task.cancel()
            err = BrokenProcessPool(
                "a worker process died or its initializer failed while the future was running or pending"
            )
            err.__cause__ = why
            fut._finish(False, err)
        self.kick()

    def refuse(self):
        """The error `submit` raises once the executor no longer accepts work."""
        if self.broken is not None:
            return BrokenProcessPool(self.broken)
        if _exiting:
            return RuntimeError("cannot schedule new futures after interpreter shutdown")
        return RuntimeError("cannot schedule new futures after shutdown")

    def collect(self) -> None:
        """The collector thread. It completes the futures somebody other than `result()`
        waits on: `wait`, `as_completed`, done-callbacks (asyncio's `wrap_future`,
        `run_in_executor`, Dask, joblib). Such a future has a condition (`_condition` makes
        it and kicks this thread).

        While any is pending, this thread waits natively (GIL released) for the tasks of
        those futures — the pool wakes it when one finishes, after a short spin — and settles
        them at once; a kick wakes it too. With none watched it sleeps until kicked: nothing
        spins or polls while nothing is pending, and callers blocked in `result()` settle
        their own futures.
        Once the executor closes, it settles every pending future, then stops the pool.
        """
        try:
            while True:
                self.rounds += 1
                with self.lock:
                    closing = self.closing
                    if closing and not self.pending:
                        return
                    watched = [f for f in self.pending if closing or _has_callbacks(f)]
                if _settle_finished(watched):
                    continue
                # Returns when one of them finishes or on a kick (a dead worker is seen after
                # a slice at the latest). The futures are not held meanwhile: one settled by
                # its caller is freed as soon as the caller drops it.
                tasks = [f._task for f in watched]
                del watched
                if tasks:
                    self.wakeup.wait(tasks, 0.05)
                    del tasks
                    self.look_for_deaths()
                else:
                    self.wakeup.wait(tasks)
                self.wakeup.clear()
        finally:
            try:
                # A broken executor's running tasks have failed already: nothing to wait for
                # (ProcessPoolExecutor terminates its workers then, too).
                self.mpool.stop(0.0 if self.broken is not None else 5.0)
            finally:
                self.stopped.set()
                _running.discard(self)


# Executors whose collector runs (their work is finished at interpreter exit).
_running: set[_State] = set()

_exiting = False


def _at_exit() -> None:
    """At interpreter exit, before `atexit` hooks: pending work is finished (never dropped),
    workers are released and later submissions raise, as with ProcessPoolExecutor."""
    global _exiting
    _exiting = True
    for st in list(_running):
        st.close()
    for st in list(_running):
        if st.collector is not None:
            st.collector.join()


try:  # what concurrent.futures itself uses: runs before atexit hooks and non-daemon joins
    threading._register_atexit(_at_exit)
except (AttributeError, RuntimeError):  # pragma: no cover
    import atexit

    atexit.register(_at_exit)


class _WorkerProcess:
    """A worker as `ProcessPoolExecutor._processes` shows it: `pid`, `is_alive()`,
    `terminate()`, `kill()` and `join(timeout)`."""

    def __init__(self, pid: int):
        self.pid = pid

    def _exited(self, timeout: float | None) -> bool:
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return True
        try:
            p = select.poll()
            p.register(fd, select.POLLIN)
            return bool(p.poll(None if timeout is None else int(timeout * 1000)))
        finally:
            os.close(fd)

    def is_alive(self) -> bool:
        return not self._exited(0)

    def join(self, timeout: float | None = None) -> None:
        self._exited(timeout)

    def _signal(self, sig) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<pymizu worker pid={self.pid}>"


class _CallQueue:
    """`ProcessPoolExecutor._call_queue`'s one public duty after shutdown: `join_thread()`
    returns once the executor has released its workers."""

    def __init__(self, state: _State):
        self._state = state

    def join_thread(self) -> None:
        self._state.stopped.wait()


def _finalize_when_gone(fn, *objs) -> None:
    """Calls `fn` once every one of `objs` is collected."""
    left = [len(objs)]

    def gone():
        left[0] -= 1
        if not left[0]:
            fn()

    for o in objs:
        weakref.finalize(o, gone)


def _failed(exc: BaseException) -> Future:
    """A future that already failed with `exc` (a call that could not be pickled)."""
    fut = Future()
    fut.set_exception(exc)
    return fut


def _spawn_context(mp_context):
    if mp_context is None:
        return multiprocessing.get_context("spawn")
    method = mp_context.get_start_method(allow_none=False)
    if method != "spawn":
        raise ValueError(
            f"PoolExecutor starts fresh interpreters (the 'spawn' start method); a {method!r} "
            "context cannot be used: pass mp_context=None or multiprocessing.get_context('spawn')"
        )
    return mp_context


class PoolExecutor(Executor):
    """A process pool executor over shared memory.

    `PoolExecutor(max_workers=None, mp_context=None, initializer=None, initargs=(), *,
    max_tasks_per_child=None, exec_timeout=None)` behaves as `ProcessPoolExecutor`: `submit`
    returns a real `concurrent.futures.Future` (so `wait`, `as_completed` and
    `asyncio.wrap_future` work), `map` and `shutdown(wait, cancel_futures=...)` work as
    documented there, an exception raised in a task is re-raised as the same type with the
    remote traceback as its `__cause__`, an argument that cannot be pickled fails its future,
    and a worker that dies (or an initializer that fails) breaks the executor: pending futures
    fail with `BrokenProcessPool` and `submit` raises it. Workers are fresh interpreters
    (`mp_context` may be None or a spawn context) that share this process's authentication
    key, so `multiprocessing` managers, queues and locks work as arguments and in `initargs`.
    An executor dropped without `shutdown()` finishes its work and releases its workers; so
    does one still open at interpreter exit.

    `replace_dead_workers=True` departs from `ProcessPoolExecutor` for long-lived services
    (the Dask integration uses it): a worker that dies fails only the task it was running
    (`WorkerDiedError`) and is replaced; the executor serves on.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        mp_context=None,
        initializer=None,
        initargs: tuple = (),
        *,
        max_tasks_per_child: int | None = None,
        exec_timeout: float | None = None,
        replace_dead_workers: bool = False,
    ):
        if max_workers is not None:
            if not isinstance(max_workers, int) or isinstance(max_workers, bool):
                raise TypeError(f"max_workers must be an int or None, got {max_workers!r}")
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
        self._mp_context = _spawn_context(mp_context)
        self._mpool = Pool(
            max_workers,
            initializer=initializer,
            initargs=initargs,
            max_tasks_per_child=max_tasks_per_child,
            exec_timeout=exec_timeout,
            # One worker now, the others as tasks in flight outnumber the workers (an idle one
            # is reused first), as ProcessPoolExecutor starts them.
            _start=1,
        )
        self._max_workers = self._mpool.workers
        self._pool = self._mpool._pool
        self._state = st = _State(self._mpool)
        st.recovers = bool(replace_dead_workers)
        st.collector = threading.Thread(target=st.collect, name="pymizu-collector", daemon=True)
        _running.add(st)
        st.collector.start()
        # `submit` itself, natively (the method below documents it) — unless a subclass
        # overrides it.
        self._future_class = st.future_class()
        self._pool.bind_executor(self._future_class, st, _failed)
        if type(self).submit is PoolExecutor.submit:
            self.submit = self._pool.submit_function("future")
            # A bound method keeps its instance: `PoolExecutor(2).submit(f)` drops the
            # executor before the call, and `s = ex.submit; del ex; s(f)` still submits. The
            # native function holds the pool, not the executor, so the executor is released
            # once both are gone.
            _finalize_when_gone(st.close, self, self.submit)
        else:
            weakref.finalize(self, st.close)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        # No lock on this hot path: a submit racing `shutdown` looks at the flag again once
        # its future is registered (where shutdown and the collector find it), and withdraws
        # it if shutdown began meanwhile.
        st = self._state
        if not st.accepting:
            raise st.refuse()
        try:
            # Pickling happens here, in the caller (small calls are written natively). The
            # native submit refuses a forked child's copy of the pool. When every task slot
            # holds an uncollected result (e.g. a large `map`), it moves finished outcomes
            # into their tasks to make room.
            task = self._pool.submit_call(fn, *args, **kwargs)
        except MizuError:
            if st.broken is not None:
                raise st.refuse() from None
            raise
        except Exception as e:
            # A call that cannot be pickled fails through its future, as with
            # ProcessPoolExecutor.
            return _failed(e)
        return self._register(task)

    def _submit_payload(self, data, bufs, head=None) -> _MizuFuture:
        self._mpool._check()
        if not self._state.accepting:
            raise self._state.refuse()
        return self._register(self._pool.submit(data, bufs, head))

    def _register(self, task) -> _MizuFuture:
        """The future of a submitted `task`, among the pending ones. (Added outside the
        state's lock: adding may settle futures nobody observes, which can break the executor
        under that lock. A shutdown or break that began meanwhile either saw the future, and
        settles it, or is seen here, and the submission is withdrawn.)"""
        st = self._state
        fut = _new_future(self._future_class, task)
        st.pending.add(fut)
        if not st.accepting:
            st.pending.discard(fut)
            task.cancel()
            raise st.refuse()
        return fut

    def map(self, fn, *iterables, timeout: float | None = None, chunksize: int | None = None):
        """As `ProcessPoolExecutor.map`: an iterator of `fn(*xs)` in input order, raising
        `TimeoutError` when a result is not ready `timeout` seconds after the call. Elements
        travel in chunks of `chunksize` (default: the runtime's chunks, in rounds of one per worker
        that shrink towards the end, so that the workers finish together). The iterator
        holds no reference to a result it has yielded."""
        if chunksize is not None and (not isinstance(chunksize, int) or chunksize < 1):
            raise ValueError("chunksize must be >= 1.")
        # A large argument every element (or the function) passes goes once, shared.
        fn = _share.share_fn(fn)
        # One iterable: its elements travel as they are (`fn(x)`), not as 1-tuples.
        items, star = map_items(iterables)
        n = items_len(items)
        deadline = None if timeout is None else time.monotonic() + timeout
        futs = []
        # The runtime's chunks (rounds of one per worker, shrinking), each submitted as soon
        # as it is pickled.
        ref = _codec.fn_ref(fn)
        for s, k in _native.chunk_plan(n, self._max_workers, chunksize):
            try:
                payload = chunk_call(fn, ref, s, chunk_of(items, s, k), star, None, 0)
            except Exception as e:
                futs.append(_failed(e))
                continue
            futs.append(self._submit_payload(*payload))
        del items

        def chunks():
            try:
                futs.reverse()
                while futs:
                    if not futs[-1].done():
                        # Streamed: the runtime may let a ready result wait a little to wake
                        # this thread less often (`wait_ahead`); the `result` below raises
                        # the TimeoutError past the deadline.
                        left = None if deadline is None else max(0.0, deadline - time.monotonic())
                        rest = [f._task for f in reversed(futs) if isinstance(f, _MizuFuture)]
                        _native.wait_ahead(rest, left, True)
                    if deadline is None:
                        yield futs[-1].result()
                    else:
                        yield futs[-1].result(deadline - time.monotonic())
                    futs.pop()
            finally:
                for f in futs:
                    f.cancel()

        # The elements are handed out natively, each chunk's place cleared as it goes.
        return _native.Elements(chunks())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        st = self._state
        st.close(cancel_futures)
        if wait and threading.current_thread() is not st.collector:
            st.collector.join()
        # Else, as ProcessPoolExecutor: return now; the collector releases the workers once
        # the work is done.

    @property
    def _broken(self):
        """False, or why the executor broke (ProcessPoolExecutor's attribute)."""
        return self._state.broken or False

    @property
    def _processes(self) -> dict:
        """pid -> worker process, for the workers running or starting now
        (ProcessPoolExecutor's attribute)."""
        if self._state.stopped.is_set():
            return {}
        return {
            pid: _WorkerProcess(pid)
            for _, pid, state, *_ in self._pool.status()
            if pid and state in ("ready", "starting")
        }

    @property
    def _executor_manager_thread(self) -> threading.Thread:
        """The thread that finishes the work after shutdown and releases the workers."""
        return self._state.collector

    @property
    def _call_queue(self) -> _CallQueue:
        return _CallQueue(self._state)

    @property
    def _collector_rounds(self) -> int:
        return self._state.rounds

    def _status(self):
        """Per worker: (slot, pid, state, busy, tasks) — for tests and diagnostics."""
        return self._pool.status()
