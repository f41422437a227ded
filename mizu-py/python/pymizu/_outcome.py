"""A task's outcome as Python sees it: the value, or the exception it raised (with its remote
traceback), or why it has none (worker died, execution timeout, cancelled, pool stopped)."""

from __future__ import annotations

import sys
from typing import Any

from . import _codec
from ._errors import (
    CancelledError,
    ExecTimeoutError,
    PayloadError,
    RemoteTraceback,
    StoppedError,
    TaskError,
    WorkerDiedError,
)

_MAX_SLOT = 2**64 - 1 if sys.maxsize > 2**32 else 2**32 - 1


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
