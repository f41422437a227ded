"""Exceptions raised by pymizu. Every one derives from `MizuError`, except a task's own
exception, which is re-raised as itself."""

from concurrent.futures import CancelledError
from concurrent.futures.process import BrokenProcessPool

# The `__cause__` of a re-raised task exception, carrying the worker-side traceback in `.tb`:
# the standard library's own class, so that code written for `ProcessPoolExecutor` (and its
# tests) recognises it.
from concurrent.futures.process import _RemoteTraceback as RemoteTraceback

from ._native import ForkedError, MizuError, SlotsFull, StoppedError

__all__ = [
    "CancelledError",
    "ExecTimeoutError",
    "ForkedError",
    "InitializerError",
    "MizuError",
    "PayloadError",
    "RemoteTraceback",
    "SlotsFull",
    "StoppedError",
    "TaskError",
    "WorkerDiedError",
]


class TaskError(MizuError):
    """A task raised an exception that could not travel back as itself (not picklable);
    `type_name` and `traceback` say what it was."""

    def __init__(self, type_name: str, message: str, traceback: str = ""):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.traceback = traceback

    def __reduce__(self):
        return (type(self), (self.type_name, self.message, self.traceback))


class WorkerDiedError(MizuError, BrokenProcessPool):
    """The worker running the task died (killed, `os._exit`, crash). The pool replaced it."""

    def __init__(self, slot: int, pid: int):
        super().__init__(f"worker {slot} (pid {pid}) died while running the task; the pool replaced it")
        self.slot = slot
        self.pid = pid

    def __reduce__(self):
        return (type(self), (self.slot, self.pid))


class ExecTimeoutError(MizuError, TimeoutError):
    """The task ran longer than the pool's `exec_timeout`; its worker was killed and replaced."""

    def __init__(self, slot: int, pid: int):
        super().__init__(f"task exceeded the execution timeout on worker {slot} (pid {pid})")
        self.slot = slot
        self.pid = pid

    def __reduce__(self):
        return (type(self), (self.slot, self.pid))


class InitializerError(MizuError, BrokenProcessPool):
    """The pool's `initializer` raised in a worker; every task sent to that worker fails so."""


class PayloadError(MizuError, BrokenProcessPool):
    """A task's call could not be unpickled in the worker, or its result or exception in the
    caller (what `ProcessPoolExecutor` reports as a broken pool); the message names the
    original error, and the `__cause__` is the remote traceback (a call) or the unpickling
    error (a result or exception)."""

