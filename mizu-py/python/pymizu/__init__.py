"""pymizu: parallel Python over shared memory.

`PoolExecutor` is a drop-in for `concurrent.futures.ProcessPoolExecutor` whose workers are
fresh interpreters (`python -m pymizu.worker`) fed through shared-memory rings instead of pipes.
"""

from ._errors import MizuError, TaskError, WorkerDiedError, ExecTimeoutError, StoppedError
from ._executor import PoolExecutor

__all__ = ["PoolExecutor", "MizuError", "TaskError", "WorkerDiedError", "ExecTimeoutError", "StoppedError"]
