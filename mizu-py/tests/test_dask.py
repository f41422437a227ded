"""Dask on mizu: the local scheduler with a PoolExecutor, and a real distributed LocalCluster
whose workers run their tasks in mizu pools (`pymizu.dask.MizuPlugin`)."""

import os
import signal

import dask
import dask.bag as db
import distributed
import pytest
from dask import delayed

import pymizu
import pymizu.dask
from pymizu import WorkerDiedError


def _inc(x):
    return x + 1


def _where(_):
    return os.getpid(), os.getppid()


def _die(_):
    os.kill(os.getpid(), signal.SIGKILL)


def _fail(_):
    raise KeyError("no such key")


def _shm():
    return {n for n in os.listdir("/dev/shm") if n.startswith("mizu")}


def test_local_scheduler_with_a_pool_executor():
    with pymizu.PoolExecutor(2) as ex:
        pids = dask.compute(*[delayed(_where)(i) for i in range(20)], scheduler=ex)
        assert {ppid for _, ppid in pids} == {os.getpid()}
        assert {pid for pid, _ in pids} <= set(ex._processes)
        total = dask.compute(delayed(sum)([delayed(_inc)(i) for i in range(100)]), scheduler=ex)[0]
        assert total == sum(range(1, 101))
        with dask.config.set(scheduler=ex):
            bag = db.from_sequence(range(1000), npartitions=8).map(_inc)
            assert bag.sum().compute() == sum(range(1, 1001))
        with pytest.raises(KeyError, match="no such key"):
            dask.compute(delayed(_fail)(1), scheduler=ex)


@pytest.fixture(scope="module")
def cluster():
    before = _shm()
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        yield cluster
    # Closing the cluster closed every worker's mizu executor: nothing is left behind.
    assert _shm() - before == set()


def test_distributed_workers_run_tasks_in_mizu_pools(cluster):
    with distributed.Client(cluster) as client:
        client.register_plugin(pymizu.dask.MizuPlugin())
        dask_workers = set(client.run(os.getpid).values())
        places = client.gather(client.map(_where, range(20)))
        for pid, ppid in places:
            # Each task ran in a process the Dask worker started: its mizu pool.
            assert ppid in dask_workers and pid not in dask_workers
        executors = client.run(lambda dask_worker: sorted(dask_worker.executors))
        for names in executors.values():
            assert "mizu" in names
        assert client.submit(_inc, 41).result() == 42


def test_distributed_errors_and_worker_death(cluster):
    with distributed.Client(cluster) as client:
        client.register_plugin(pymizu.dask.MizuPlugin())
        with pytest.raises(KeyError, match="no such key"):
            client.submit(_fail, 1).result()
        with pytest.raises(WorkerDiedError):
            client.submit(_die, 1, pure=False).result()
        # The dead mizu worker was replaced: the next tasks succeed.
        assert client.gather(client.map(_inc, range(10))) == list(range(1, 11))


def test_annotate_routes_tasks_to_the_mizu_executor(cluster):
    with distributed.Client(cluster) as client:
        client.register_plugin(pymizu.dask.MizuPlugin(default=False))
        dask_workers = set(client.run(os.getpid).values())
        plain = client.submit(_where, 0, pure=False).result()
        assert plain[0] in dask_workers  # the worker's own threads
        with dask.annotate(executor=pymizu.dask.EXECUTOR_NAME):
            x = delayed(_where)(1)
        pid, ppid = client.compute(x).result()
        assert ppid in dask_workers and pid not in dask_workers


def test_preload_module_gives_each_worker_a_mizu_executor():
    before = _shm()
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        preload=["pymizu.dask"],
    ) as cluster, distributed.Client(cluster) as client:
        dask_workers = set(client.run(os.getpid).values())
        kinds = client.run(lambda dask_worker: type(dask_worker.executors["default"]).__name__)
        assert set(kinds.values()) == {"PoolExecutor"}
        for pid, ppid in client.gather(client.map(_where, range(10))):
            assert ppid in dask_workers and pid not in dask_workers
    assert _shm() - before == set()
