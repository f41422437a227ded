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
from ._channel import CLOSED, FULL, PEER_GONE, TIMEOUT, Channel
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
