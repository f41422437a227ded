"""pymizu: parallel Python over shared memory.

* `PoolExecutor` — a drop-in for `concurrent.futures.ProcessPoolExecutor`;
* `Pool` / `Task` — submit, batches, `collect_any` / `collect_all`, ordered `map` / `starmap`
  / `imap` with `seed=`, `chunksize=`, `timeout=`, `progress=`; `await task` in asyncio;
* `Channel` — messages between two processes (`send`/`recv`, sentinels `FULL`, `TIMEOUT`,
  `CLOSED`, `PEER_GONE`);
* `pymizu.wire` — the cross-language value format; Arrow data as `ArrowArray` / `ArrowTable`
  (Arrow PyCapsule interface);
* `Pool(n, language="r")` — R workers running `pymizu.call(...)` tasks (values cross as in
  docs/interop.md; numeric arrays as zero-copy views); Python workers serve R pools too;
* `current_pool()` for nested maps inside a task, `current_rng()` for reproducible random
  numbers inside a seeded map element.

Workers are fresh interpreters (`python -m pymizu.worker`) fed through shared-memory rings;
large buffers (numpy, pandas, pyarrow, polars) cross as read-only views of shared memory.
See docs/python.md.
"""

TYPE_CHECKING = False  # (typing itself costs a worker's start-up ~9 ms)

# Where each public name lives. `import pymizu` imports none of them: a name is imported when
# first used (PEP 562), so that a worker (`python -m pymizu.worker`, which imports this package
# first) starts without what only a caller uses — asyncio, concurrent.futures,
# multiprocessing, logging — and a pool starts as fast as its interpreters do.
_WHERE = {
    "CancelledError": "_errors",
    "ExecTimeoutError": "_errors",
    "ForkedError": "_errors",
    "InitializerError": "_errors",
    "MizuError": "_errors",
    "PayloadError": "_errors",
    "RemoteTraceback": "_errors",
    "SlotsFull": "_errors",
    "StoppedError": "_errors",
    "TaskError": "_errors",
    "WorkerDiedError": "_errors",
    "CLOSED": "_channel",
    "FULL": "_channel",
    "PEER_GONE": "_channel",
    "TIMEOUT": "_channel",
    "Channel": "_channel",
    "PoolExecutor": "_executor",
    "Pool": "_pool",
    "Task": "_pool",
    "current_pool": "_pool",
    "current_rng": "_rng",
    "empty": "_share",
    "is_shared": "_share",
    "share": "_share",
    "zeros": "_share",
    "PythonTaskError": "_xlang",
    "RError": "_xlang",
    "RWarning": "_xlang",
    "call": "_xlang",
    "ArrowArray": "wire",
    "ArrowTable": "wire",
}


#: Submodules that import a third-party library (joblib, dask).
_INTEGRATIONS = frozenset({"joblib", "dask"})


def __getattr__(name: str):
    import importlib

    where = _WHERE.get(name)
    if where is None:
        # The integrations are attributes once imported (`import pymizu.joblib`), as in any
        # package: looking for one (`hasattr`, a tool walking modules) imports no third-party
        # library and never raises its ImportError.
        if name.startswith("__") or name in _INTEGRATIONS:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        # A submodule not imported yet (`pymizu._native`, `pymizu.joblib`).
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:
    from ._channel import CLOSED, FULL, PEER_GONE, TIMEOUT, Channel
    from ._errors import (
        CancelledError,
        ExecTimeoutError,
        ForkedError,
        InitializerError,
        MizuError,
        PayloadError,
        RemoteTraceback,
        SlotsFull,
        StoppedError,
        TaskError,
        WorkerDiedError,
    )
    from ._executor import PoolExecutor
    from ._pool import Pool, Task, current_pool
    from ._rng import current_rng
    from ._share import empty, is_shared, share, zeros
    from ._xlang import PythonTaskError, RError, RWarning, call
    from .wire import ArrowArray, ArrowTable

__all__ = [
    "CLOSED",
    "FULL",
    "PEER_GONE",
    "TIMEOUT",
    "ArrowArray",
    "ArrowTable",
    "CancelledError",
    "Channel",
    "ExecTimeoutError",
    "ForkedError",
    "InitializerError",
    "MizuError",
    "PayloadError",
    "Pool",
    "PoolExecutor",
    "RemoteTraceback",
    "SlotsFull",
    "StoppedError",
    "Task",
    "TaskError",
    "WorkerDiedError",
    "PythonTaskError",
    "RError",
    "RWarning",
    "call",
    "current_pool",
    "current_rng",
    "empty",
    "is_shared",
    "share",
    "zeros",
]
