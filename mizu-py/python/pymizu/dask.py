"""Dask on mizu.

On one machine, Dask's local scheduler takes any `concurrent.futures` executor:

    dask.compute(x, scheduler=pymizu.PoolExecutor())
    with dask.config.set(scheduler=pymizu.PoolExecutor()): ...

With Dask distributed, every worker can run its tasks in a mizu pool on its own node, so that
a task's inputs and outputs move between the Dask worker and the process running it through
shared memory (Dask moves data between nodes as it always does):

    client.register_plugin(pymizu.dask.MizuPlugin())        # on a running cluster
    dask worker tcp://scheduler:8786 --preload pymizu.dask    # on each node

The plugin gives each Dask worker a `pymizu.PoolExecutor` — as its default executor and
under the name "mizu" for `dask.annotate(executor="mizu")` — closed when the worker closes.
A mizu worker that dies fails only the task it ran (Dask reports `WorkerDiedError`) and is
replaced; the Dask worker serves on.
"""

from __future__ import annotations

import os

from ._executor import PoolExecutor

__all__ = ["MizuPlugin", "EXECUTOR_NAME", "dask_setup", "dask_teardown"]

#: The name under which a Dask worker holds its mizu executor.
EXECUTOR_NAME = "mizu"

try:
    from distributed import WorkerPlugin as _PluginBase
except ImportError:  # only the local-scheduler part (a PoolExecutor) needs no distributed
    _PluginBase = object


class MizuPlugin(_PluginBase):
    """A `distributed` worker plugin: each Dask worker gets a `pymizu.PoolExecutor`.

    `n_workers`: processes per Dask worker (default: the Dask worker's thread count, so the
    worker's task concurrency is unchanged). `default`: also make it the worker's default
    executor (else tasks reach it only through `dask.annotate(executor="mizu")`).
    """

    name = "pymizu"

    def __init__(self, n_workers: int | None = None, default: bool = True):
        if n_workers is not None and (not isinstance(n_workers, int) or n_workers < 1):
            raise ValueError("n_workers must be a positive integer or None")
        self.n_workers = n_workers
        self.default = default
        self._replaced = None

    def setup(self, worker) -> None:
        n = self.n_workers or getattr(worker.state, "nthreads", None) or os.cpu_count() or 1
        ex = PoolExecutor(n, replace_dead_workers=True)
        worker.executors[EXECUTOR_NAME] = ex
        if self.default:
            # The worker's own default executor is kept, to be put back by teardown.
            self._replaced = worker.executors.get("default")
            worker.executors["default"] = ex

    def teardown(self, worker) -> None:
        ex = worker.executors.get(EXECUTOR_NAME)
        if isinstance(ex, PoolExecutor):
            del worker.executors[EXECUTOR_NAME]
            if worker.executors.get("default") is ex:
                if self._replaced is not None:
                    worker.executors["default"] = self._replaced
                else:
                    del worker.executors["default"]
            ex.shutdown(wait=True, cancel_futures=True)
        self._replaced = None


def dask_setup(worker) -> None:
    """`dask worker --preload pymizu.dask`: installs `MizuPlugin()` on the worker."""
    plugin = MizuPlugin()
    plugin.setup(worker)
    worker._pymizu_plugin = plugin


def dask_teardown(worker) -> None:
    """The preload's counterpart of `dask_setup`: closes the worker's mizu executor."""
    plugin = getattr(worker, "_pymizu_plugin", None)
    if plugin is not None:
        plugin.teardown(worker)
