"""Runs joblib's own `test_parallel.py` with pymizu's backend among the process backends.

    python mizu-py/tests/joblib_suite.py PATH/TO/joblib-X.Y.Z [pytest args]

The file comes from the source distribution of the pinned joblib (`cargo xtask test` fetches
it); it is not part of this repository. `"mizu"` is added to the process backends the file
parametrizes over (and to joblib's registry before it is imported, so the cases over every
valid backend include it), and the cases that run on mizu run: every case whose id names it,
and every case parametrized with an instance of the backend (joblib's ids for those are
`backendN`). The few that need what mizu deliberately does not do are listed in `EXPECTED_TO_FAIL`
with the reason, and run as strict expected failures: one that starts passing fails the run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

# Test id -> why it cannot pass on mizu (docs/python.md says the same).
EXPECTED_TO_FAIL: dict[str, str] = {
    "test_auto_memmap_on_arrays_from_generator[mizu]": "checks that large arrays arrive as "
    "np.memmap objects; mizu sends them as read-only views of shared memory instead",
    "test_memmapping_leaks[mizu]": "checks for np.memmap arguments and joblib's temporary "
    "memmap folder, which mizu does not use",
}

# The lines of the file that change: the process backends, and an import that registers the
# backend wherever the file is imported (in the workers of other backends too, which run
# nested `Parallel` calls on mizu).
EDITS = {
    'PROCESS_BACKENDS = ["multiprocessing", "loky"]':
        'PROCESS_BACKENDS = ["multiprocessing", "loky", "mizu"]',
    "\nimport pytest\n": "\nimport pytest\n\nimport pymizu.joblib  # noqa: F401\n",
}

CONFTEST = f'''
import pytest
import pymizu.joblib  # noqa: F401  (registers the backend before test_parallel is collected)

EXPECTED_TO_FAIL = {EXPECTED_TO_FAIL!r}


def pytest_configure(config):
    config.addinivalue_line("markers", "thread_unsafe: joblib's marker")


def on_mizu(item):
    """Whether the case runs on mizu: its id names it, or a parameter is the backend itself."""
    if "mizu" in item.name:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {{}})
    return any(isinstance(v, pymizu.joblib.MizuBackend) for v in params.values())


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if on_mizu(item)]
    config.hook.pytest_deselected(items=[item for item in items if not on_mizu(item)])
    items[:] = kept
    for item in items:
        why = EXPECTED_TO_FAIL.get(item.name)
        if why is not None:
            item.add_marker(pytest.mark.xfail(reason=why, strict=True))
'''


def main() -> int:
    sdist, args = sys.argv[1], sys.argv[2:]
    source = os.path.join(sdist, "joblib", "test", "test_parallel.py")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    for old, new in EDITS.items():
        if text.count(old) != 1:
            print(f"{source}: not one {old!r} to change", file=sys.stderr)
            return 2
        text = text.replace(old, new)
    # Its own directory, on the path of this process and (through PYTHONPATH) of the workers,
    # which import the test functions they run from the same module.
    root = tempfile.mkdtemp(prefix="joblib-tests-")
    try:
        with open(os.path.join(root, "test_parallel.py"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(root, "conftest.py"), "w", encoding="utf-8") as f:
            f.write(CONFTEST)
        # Some cases run a script of theirs in a fresh interpreter that names the backend
        # without importing anything of mizu's: as it would for a user's script that imports
        # pymizu.joblib, the backend is registered when that interpreter starts.
        with open(os.path.join(root, "sitecustomize.py"), "w", encoding="utf-8") as f:
            f.write("import pymizu.joblib  # noqa: F401\n")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        sys.path.insert(0, root)
        import pytest

        return pytest.main(
            ["-q", "-p", "no:cacheprovider", "--rootdir", root, *args,
             os.path.join(root, "test_parallel.py")]
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
