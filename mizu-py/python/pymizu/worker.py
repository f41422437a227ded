"""Worker entry point: `python -m pymizu.worker [--workers N] [--max-tasks N] [--start FILE]
<token> <slot>` (started by the pool; not for direct use)."""

from __future__ import annotations

import os
import pickle
import sys

from . import _batches, _codec, _native

_init_error: BaseException | None = None
_loads_call = _codec.loads_call


def _fail(e: BaseException, tb: str | None = None) -> tuple[bool, bytes, list]:
    import traceback  # (only when a task fails: it costs a worker's start-up ~2 ms)

    if tb is None:
        tb = traceback.format_exc()
    try:
        data, bufs = _codec.dumps((e, tb))
    except Exception:
        from ._errors import TaskError

        data, bufs = _codec.dumps((TaskError(type(e).__qualname__, str(e), tb), tb))
    return False, data, bufs


def _fail_native(e: BaseException) -> tuple[bool, bytes, list]:
    """An exception raised in a call the native layer ran (a small call), with its traceback."""
    import traceback

    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return _fail(e, tb)


def _result_native(value) -> tuple[bool, bytes, list]:
    """A result the native layer cannot send as a small value."""
    batch, _batches._batch_out = _batches._batch_out, None
    try:
        out, bufs = _codec.dumps(value)
    except Exception:
        if value is not batch:
            raise
        # A chunk's values: those that cannot be pickled fail their own calls.
        out, bufs = _codec.dumps(_batches._batch_result(value))
    return True, out, bufs


def _run(data, bufs, head=None) -> tuple:
    if _init_error is not None:
        try:
            # (Without its last traceback: raising an exception again extends the one it
            # has, and every failed task would carry all the earlier ones' frames.)
            raise _init_error.with_traceback(None)
        except BaseException as e:
            return _fail(e)
    try:
        fn, args, kwargs = _loads_call(data, bufs, head)
    except BaseException as e:  # unpickling runs arbitrary code, even `sys.exit()`
        import traceback

        tb = traceback.format_exc()
        from ._errors import PayloadError

        return _fail(PayloadError(f"the task's call could not be unpickled in the worker: {e!r}"), tb)
    try:
        del data, bufs, head
        result = fn(*args, **kwargs)
        # The native layer sends the value (pickling it through `_result_native` when it is
        # not a small one).
        return None, result, None
    except BaseException as e:  # everything a task raises goes back to the caller
        return _fail(e)


def _share_authkey(key: bytes) -> None:
    """Gives this process the caller's multiprocessing authkey, so that the caller's managers'
    proxies connect from its tasks — when multiprocessing is first imported: importing it here
    would cost every worker's start-up ~5 ms, and most tasks never use it."""
    if "multiprocessing.process" in sys.modules:
        sys.modules["multiprocessing.process"].current_process().authkey = key
    else:
        sys.meta_path.insert(0, _AuthkeyOnImport(key))


class _AuthkeyOnImport:
    """An import finder that only wraps the loader of `multiprocessing.process`, then leaves."""

    def __init__(self, key: bytes):
        self.key = key

    def find_spec(self, name, path=None, target=None):
        if name != "multiprocessing.process":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenAuthkey(spec.loader, self.key)
        return spec


class _ThenAuthkey:
    """A module loader that sets the authkey once `multiprocessing.process` has run."""

    def __init__(self, loader, key: bytes):
        self._loader, self._key = loader, key

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.current_process().authkey = self._key

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _start(path: str) -> None:
    """Reproduces the caller's import state, then runs the pool's initializer."""
    global _init_error
    with open(path, "rb") as f:
        state = pickle.load(f)
    if state.get("authkey"):
        _share_authkey(state["authkey"])
    for p in reversed(state["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    # Functions defined in the caller's script pickle as `__main__.f`: load the script as
    # `__mp_main__` (its `if __name__ == "__main__":` block does not run), as
    # multiprocessing's spawn does; a module run with `-m` is imported by name.
    main_path, main_module = state["main_path"], state.get("main_module")
    if main_path or main_module:
        os.environ["PYMIZU_BOOTING"] = "1"
        argv = sys.argv
        sys.argv = list(state.get("sys_argv", argv))  # the script sees the caller's arguments
        try:
            if main_module:
                import importlib

                main = importlib.import_module(main_module)
            elif os.path.exists(main_path):
                import runpy

                mod = runpy.run_path(main_path, run_name="__mp_main__")
                main = type(sys)("__mp_main__")
                main.__dict__.update(mod)
            else:
                main = None
            if main is not None:
                sys.modules["__mp_main__"] = sys.modules["__main__"] = main
        except BaseException as e:
            from ._errors import InitializerError

            _init_error = InitializerError(f"importing the caller's main module failed: {e!r}")
            return
        finally:
            del os.environ["PYMIZU_BOOTING"]
            sys.argv = argv
    if state["init"] is not None:
        try:
            fn, args = _codec.loads(state["init"])
            fn(*args)
        except BaseException as e:
            import traceback

            from ._errors import InitializerError

            _init_error = InitializerError(
                f"the pool's initializer raised {e!r}\n{traceback.format_exc()}"
            )
            # Where ProcessPoolExecutor's workers report it.
            import logging

            logging.getLogger("concurrent.futures").critical("Exception in initializer:", exc_info=True)
            # This worker only fails tasks from now on: release the multiprocessing objects
            # it holds as an exiting worker would (flushing queues, so that what the
            # initializer logged through one arrives before its tasks' errors).
            if "multiprocessing" in sys.modules:
                from multiprocessing import util

                util._run_finalizers(0)


def main() -> None:
    argv = sys.argv[1:]
    opts = {}
    while argv and argv[0].startswith("--"):
        if len(argv) < 2:
            sys.exit(f"pymizu.worker: {argv[0]} needs a value")
        opts[argv[0]] = argv[1]
        argv = argv[2:]
    if len(argv) != 2:
        sys.exit("usage: python -m pymizu.worker [--workers N] [--max-tasks N] [--start FILE] <token> <slot>")
    _native.exit_if_orphaned_while_starting()
    if "--workers" in opts:
        os.environ["PYMIZU_WORKERS"] = opts["--workers"]
    if "--start" in opts:
        _start(opts["--start"])
    # What start-up imported lives as long as the worker: out of the collector's way, so
    # that the collections the tasks' allocations trigger look only at what they made.
    import gc

    gc.collect()
    gc.freeze()
    _native.run_worker(
        argv[0],
        int(argv[1]),
        _run,
        _fail_native,
        _result_native,
        int(opts.get("--max-tasks", "0")),
        _init_error is None,
    )


if __name__ == "__main__":
    main()
