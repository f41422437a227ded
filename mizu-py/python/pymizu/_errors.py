"""Exceptions raised by pymizu."""

from concurrent.futures.process import BrokenProcessPool


class MizuError(Exception):
    """Base class of pymizu's own errors."""


class TaskError(MizuError):
    """A task raised an exception that could not be sent back as itself (not picklable)."""

    def __init__(self, type_name: str, message: str, traceback: str = ""):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.traceback = traceback


class WorkerDiedError(MizuError, BrokenProcessPool):
    """The worker running the task died (killed, os._exit, crash). The pool replaced it."""

    def __init__(self, slot: int, pid: int):
        super().__init__(f"worker {slot} (pid {pid}) died while running the task; the pool replaced it")
        self.slot = slot
        self.pid = pid


class ExecTimeoutError(MizuError, TimeoutError):
    """The task ran longer than the pool's execution timeout; its worker was replaced."""

    def __init__(self, slot: int, pid: int):
        super().__init__(f"task exceeded the execution timeout on worker {slot} (pid {pid})")
        self.slot = slot
        self.pid = pid


class StoppedError(MizuError):
    """The pool stopped before the task ran."""


class RemoteTraceback(Exception):
    """Carries the worker-side traceback as the `__cause__` of a re-raised task exception."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb
