"""Worker entry point: `python -m pymizu.worker <token> <slot>` (started by the pool)."""

import pickle
import sys
import traceback

from . import _native


def _run(payload: bytes) -> tuple[bool, bytes]:
    try:
        fn, args, kwargs = pickle.loads(payload)
        return True, pickle.dumps(fn(*args, **kwargs), protocol=5)
    except BaseException as e:  # everything a task raises goes back to the caller
        tb = traceback.format_exc()
        try:
            return False, pickle.dumps((e, tb), protocol=5)
        except Exception:
            from ._errors import TaskError

            return False, pickle.dumps((TaskError(type(e).__qualname__, str(e), tb), tb), protocol=5)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python -m pymizu.worker <token> <slot>")
    _native.run_worker(sys.argv[1], int(sys.argv[2]), _run)


if __name__ == "__main__":
    main()
