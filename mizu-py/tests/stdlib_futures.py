"""Runs CPython's own process-pool tests of `concurrent.futures` against `pymizu.PoolExecutor`.

    python mizu-py/tests/stdlib_futures.py PATH/TO/test_concurrent_futures.py [unittest args]

The file comes from Debian's `libpython3.11-testsuite` package (`cargo xtask test` fetches it);
it is not part of this repository. Its spawn-context process-pool test classes run with
`PoolExecutor` wherever they name `ProcessPoolExecutor`, including in the child interpreters
some tests start. The tests that only inspect stdlib-private machinery with no counterpart in
pymizu are listed in `EXCLUDED` (and in docs/python.md); every other one must pass.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import types
import unittest

# Test name -> why it does not apply to PoolExecutor (docs/python.md lists the same).
EXCLUDED: dict[str, str] = {
    "test_hang_gh83386": "CPython skips it for process pools itself (it hangs "
    "ProcessPoolExecutor), and its child program does not run as written with a start method",
    "test_max_workers_too_large": "Windows only",
}

# The stdlib classes whose tests apply: a process pool started by spawning interpreters.
SPAWN_CLASSES = (
    "ProcessPoolSpawnInitializerTest",
    "ProcessPoolSpawnFailingInitializerTest",
    "ProcessPoolSpawnProcessPoolShutdownTest",
    "ProcessPoolSpawnWaitTest",
    "ProcessPoolSpawnAsCompletedTest",
    "ProcessPoolSpawnProcessPoolExecutorTest",
    "ProcessPoolSpawnExecutorDeadlockTest",
)


def _overlay(source: str) -> str:
    """A directory holding a `test` package that is the stdlib's plus the given file, so that
    this process, pymizu's workers and the tests' child interpreters import the same
    `test.test_concurrent_futures`."""
    import sysconfig

    root = tempfile.mkdtemp(prefix="pymizu-stdlib-tests-")
    pkg = os.path.join(root, "test")
    os.mkdir(pkg)
    stdlib_test = os.path.join(sysconfig.get_paths()["stdlib"], "test")
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write(f"__path__.append({stdlib_test!r})\n")
    with open(source, encoding="utf-8") as src, open(os.path.join(pkg, "test_concurrent_futures.py"), "w") as dst:
        dst.write(src.read())
    return root


def _child_prelude(root: str) -> str:
    """What a child interpreter runs before a test's own source: the same imports, and the
    executor the test names by its class name resolving to pymizu's."""
    return (
        f"import sys; sys.path.insert(0, {root!r})\n"
        "import concurrent.futures, pymizu\n"
        "concurrent.futures.PoolExecutor = pymizu.PoolExecutor\n"
    )


def load(source: str):
    root = _overlay(source)
    sys.path.insert(0, root)
    for name in [m for m in sys.modules if m == "test" or m.startswith("test.")]:
        del sys.modules[name]
    import concurrent.futures as stdlib_futures

    import pymizu
    import test.test_concurrent_futures as mod

    # The tests' own references to the stdlib executor.
    facade = types.ModuleType("concurrent.futures")
    facade.__dict__.update(stdlib_futures.__dict__)
    facade.ProcessPoolExecutor = pymizu.PoolExecutor
    facade.process = stdlib_futures.process
    mod.futures = facade

    prelude = _child_prelude(root)
    run_child = mod.assert_python_ok

    def assert_python_ok(*args, **env):
        args = list(args)
        if len(args) >= 2 and args[0] == "-c":
            args[1] = prelude + args[1]
        return run_child(*args, **env)

    mod.assert_python_ok = assert_python_ok

    setup = mod.setUpModule

    def set_up_module():
        setup()
        # Runs first among the module's cleanups: what the last tests left in reference
        # cycles (multiprocessing semaphores among it) is released before the cleanup stops
        # multiprocessing's resource tracker, which would report it as leaked.
        unittest.addModuleCleanup(gc.collect)

    mod.setUpModule = set_up_module
    for name in SPAWN_CLASSES:
        getattr(mod, name).executor_type = pymizu.PoolExecutor
    return mod


def suite(mod) -> unittest.TestSuite:
    loader = unittest.TestLoader()
    out = unittest.TestSuite()
    for name in SPAWN_CLASSES:
        for test in loader.loadTestsFromTestCase(getattr(mod, name)):
            if test._testMethodName not in EXCLUDED:
                out.addTest(test)
    return out


def main() -> int:
    if len(sys.argv) < 2 or not os.path.isfile(sys.argv[1]):
        print(__doc__, file=sys.stderr)
        return 2
    mod = load(sys.argv[1])
    tests = suite(mod)
    wanted = sys.argv[2:]
    if wanted:
        tests = unittest.TestSuite(t for t in tests if any(w in t.id() for w in wanted))
    result = unittest.TextTestRunner(verbosity=2).run(tests)
    return 0 if result.wasSuccessful() and not result.skipped else 1


if __name__ == "__main__":
    sys.exit(main())
