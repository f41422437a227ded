"""pymizu inside the libraries Python users reach process pools through, side by side with
their own process backends in one run, as ratios:

* joblib: `Parallel` over trivial calls and over calls taking a 100 MB array — backend "mizu"
  against "loky" and "multiprocessing" (and joblib's own cost: the sequential backend);
* Dask's local scheduler: tiny `dask.delayed` tasks and a `dask.bag.map` — a
  `pymizu.PoolExecutor` against the "processes" scheduler (and Dask's own cost: "sync");
* Dask distributed: tiny tasks through a 2-worker `LocalCluster`, with the mizu plugin and
  with the workers' own threads; and pure-Python tasks (they hold the GIL) on one Dask worker
  of two threads, with the mizu plugin (two processes) and without.

    python mizu-py/benchmarks/ecosystem.py [--quick]

Where the library's own per-call work (measured in-process, no pool at all) is most of the
time, no backend can beat it; that floor is printed beside the numbers.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from timing import peer_timed, timed  # noqa: E402

WORKERS = 2


def _inc(x):
    return x + 1


def _pick(a, i):
    return float(a[i])


def _spin(n):
    """Pure-Python work: holds the GIL throughout, as most Python code does."""
    s = 0
    for i in range(n):
        s += i * i
    return s


def joblib_rows(quick):
    from joblib import Parallel, delayed, parallel_config

    import pymizu
    import pymizu.joblib  # noqa: F401

    n_trivial = 2_000 if quick else 10_000
    n_big = 50 if quick else 200
    reps = 3 if quick else 5
    big = np.random.default_rng(0).random(100 * 2**20 // 8)  # 100 MB
    rows = {}
    for backend in ("sequential", "mizu", "loky", "multiprocessing"):
        # (The peers' runs survive joblib's own memory-mapping failures: see `peer_timed`.)
        t = timed if backend == "mizu" else lambda f, r, n: peer_timed(f"joblib {backend}", f, r, n)
        with parallel_config(backend=backend, n_jobs=WORKERS):
            trivial = t(lambda: Parallel()(delayed(_inc)(i) for i in range(n_trivial)), reps, n_trivial)
            large = t(lambda: Parallel()(delayed(_pick)(big, i) for i in range(n_big)), reps, n_big)
        rows[backend] = (trivial, large)
    # The array shared once by the program (`pymizu.share`): what "share once, read
    # everywhere" gives when the same data feeds several Parallel calls.
    shared = pymizu.share(big)
    with parallel_config(backend="mizu", n_jobs=WORKERS):
        pre = timed(lambda: Parallel()(delayed(_pick)(shared, i) for i in range(n_big)), reps, n_big)
    with parallel_config(backend="loky", n_jobs=WORKERS):
        pre_loky = peer_timed("joblib loky", lambda: Parallel()(delayed(_pick)(shared, i) for i in range(n_big)), reps, n_big)
    print(f"\njoblib {__import__('joblib').__version__}: Parallel, {WORKERS} workers, per call")
    print(f"{'':40s} {'mizu':>10s} {'loky':>10s} {'mp':>10s} {'vs loky':>8s} {'vs mp':>7s}  joblib's own (sequential)")
    for k, (label, n) in enumerate(
        [(f"{n_trivial} trivial calls", n_trivial), (f"{n_big} calls taking a 100 MB array", n_big)]
    ):
        m, lo, mp, seq = (rows[b][k] for b in ("mizu", "loky", "multiprocessing", "sequential"))
        print(f"{label:40s} {m*1e6:8.1f}us {lo*1e6:8.1f}us {mp*1e6:8.1f}us {lo/m:7.1f}x {mp/m:6.1f}x  {seq*1e6:.1f}us")
    print(f"{'... the array pymizu.share()d once':40s} {pre*1e6:8.1f}us {pre_loky*1e6:8.1f}us {'':10s} {pre_loky/pre:7.1f}x")
    # What bounds the 100 MB row from below for any backend that is handed an array it does not
    # hold yet: one copy of it per Parallel call (at memory bandwidth). Beside it, the same
    # calls with a small array: joblib's own dispatch, batching and bookkeeping on a pool.
    copy = timed(lambda: pymizu.share(big), reps) / n_big
    small = big[:n_big].copy()
    with parallel_config(backend="mizu", n_jobs=WORKERS):
        light = timed(lambda: Parallel()(delayed(_pick)(small, i) for i in range(n_big)), reps, n_big)
    print(f"{'... one 100 MB copy, per call':40s} {copy*1e6:8.1f}us")
    print(f"{'... the same calls with a small array':40s} {light*1e6:8.1f}us")
    print(f"  ({n_big} calls per Parallel: ten times loky is {rows['loky'][1]/10*1e6:.0f} us per call; "
          f"the one copy per Parallel call alone takes {copy*1e6:.0f} us of it)")


def dask_rows(quick):
    import dask
    import dask.bag as db
    from dask import delayed

    import pymizu

    n_delayed = 1_000 if quick else 10_000
    n_bag = 20_000 if quick else 100_000
    reps = 1 if quick else 3

    def run_delayed(scheduler, **kw):
        return timed(
            lambda: dask.compute(*[delayed(_inc)(i) for i in range(n_delayed)], scheduler=scheduler, **kw),
            reps,
            n_delayed,
        )

    def run_bag(scheduler, **kw):
        bag = db.from_sequence(range(n_bag), npartitions=8).map(_inc)
        return timed(lambda: bag.sum().compute(scheduler=scheduler, **kw), reps)

    with pymizu.PoolExecutor(WORKERS) as ex:
        m = (run_delayed(ex), run_bag(ex))
    p = (run_delayed("processes", num_workers=WORKERS), run_bag("processes", num_workers=WORKERS))
    s = (run_delayed("sync"), run_bag("sync"))
    print(f"\ndask {dask.__version__}: local scheduler, {WORKERS} workers")
    print(f"{'':40s} {'mizu':>10s} {'processes':>10s} {'vs proc.':>8s}  Dask's own (sync)")
    print(f"{f'{n_delayed} tiny delayed tasks, per task':40s} {m[0]*1e6:8.1f}us {p[0]*1e6:8.1f}us {p[0]/m[0]:7.1f}x  {s[0]*1e6:.1f}us")
    print(f"{f'bag.map over {n_bag} elements, whole':40s} {m[1]*1e3:8.1f}ms {p[1]*1e3:8.1f}ms {p[1]/m[1]:7.1f}x  {s[1]*1e3:.1f}ms")


def distributed_rows(quick):
    import distributed

    import pymizu.dask

    n = 1_000 if quick else 10_000
    out = {}
    for name in ("mizu", "threads"):
        with distributed.LocalCluster(
            n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster, distributed.Client(cluster) as client:
            if name == "mizu":
                client.register_plugin(pymizu.dask.MizuPlugin())
            client.gather(client.map(_inc, range(100), pure=False))
            t = time.perf_counter()
            client.gather(client.map(_inc, range(n), pure=False))
            out[name] = (time.perf_counter() - t) / n
    print(f"\ndistributed {distributed.__version__}: LocalCluster of {WORKERS} workers, {n} tiny tasks, per task")
    print(f"  mizu pool on each worker: {out['mizu']*1e6:.0f} us; the workers' own threads: "
          f"{out['threads']*1e6:.0f} us ({out['threads']/out['mizu']:.2f}x) — the scheduler's own "
          "per-task work dominates both")

    # Where the plugin pays: a worker's threads share one GIL, its mizu pool's processes do not.
    tasks, size = (20, 200_000) if quick else (100, 500_000)
    gil = {}
    for name in ("mizu", "threads"):
        with distributed.LocalCluster(
            n_workers=1, threads_per_worker=WORKERS, processes=True, dashboard_address=None
        ) as cluster, distributed.Client(cluster) as client:
            if name == "mizu":
                client.register_plugin(pymizu.dask.MizuPlugin())
            expect = _spin(size)
            assert client.gather(client.map(_spin, [size] * 4, pure=False)) == [expect] * 4

            def run():
                client.gather(client.map(_spin, [size] * tasks, pure=False))

            gil[name] = timed(run, 1 if quick else 3) / tasks
    alone = timed(lambda: _spin(size), 5)
    print(f"  {tasks} pure-Python tasks of {alone*1e3:.1f} ms on one Dask worker of {WORKERS} threads, per task: "
          f"mizu pool ({WORKERS} processes) {gil['mizu']*1e3:.2f} ms; the worker's threads "
          f"{gil['threads']*1e3:.2f} ms ({gil['threads']/gil['mizu']:.2f}x)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"pymizu in the Python ecosystem: {WORKERS} workers, {os.cpu_count()} CPUs"
          + (" (quick)" if args.quick else ""))
    joblib_rows(args.quick)
    dask_rows(args.quick)
    distributed_rows(args.quick)


if __name__ == "__main__":
    main()
