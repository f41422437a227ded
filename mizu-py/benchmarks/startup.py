"""Starting a pool: the time from making a pool to having its first trivial result, then
shutting it down — what a program pays that makes a pool for one piece of work
(`with PoolExecutor() as ex: ...` inside a function it calls again and again).

    python mizu-py/benchmarks/startup.py [--quick] [--workers N]

pymizu's workers are fresh interpreters that import the caller's script (as multiprocessing's
"spawn" does), so the rows beside it are `ProcessPoolExecutor` and `multiprocessing.Pool`
with Linux's default "fork" (the children are copies of the caller: nothing to import) and
`ProcessPoolExecutor` with "spawn", and loky (which spawns too). This script imports the peers
(and what else it uses) inside `main()`: a script's top-level imports run again in every spawned worker, pymizu's
included, and would be measured with the pool.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")


def start_use_stop(make, use) -> float:
    """Seconds from making a pool to having `use(pool)`'s result, then shutting it down."""
    t = time.perf_counter()
    pool = make()
    try:
        use(pool)
    finally:
        if hasattr(pool, "shutdown"):
            pool.shutdown()
        elif hasattr(pool, "terminate"):
            pool.terminate()
            pool.join()
        else:
            pool.stop()
    return time.perf_counter() - t


def main():
    import statistics

    from timing import pool_args

    a = pool_args()
    w = a.workers
    reps = 3 if a.quick else 9

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import loky
    import pymizu
    import work

    def submitted(pool):
        return pool.submit(work.add, 1, 1).result()

    def applied(pool):
        return pool.apply_async(work.add, (1, 1)).get()

    spawn = multiprocessing.get_context("spawn")
    rows = [
        ("pymizu.Pool", lambda: pymizu.Pool(w), submitted),
        ("pymizu.PoolExecutor", lambda: pymizu.PoolExecutor(w), submitted),
        ("ProcessPoolExecutor (fork)", lambda: ProcessPoolExecutor(w), submitted),
        ("multiprocessing.Pool (fork)", lambda: multiprocessing.Pool(w), applied),
        ("ProcessPoolExecutor (spawn)", lambda: ProcessPoolExecutor(w, mp_context=spawn), submitted),
        ("loky", lambda: loky.ProcessPoolExecutor(w), submitted),
    ]
    times = {name: [] for name, _, _ in rows}
    for name, make, use in rows:  # warm-up: each peer's own imports, the page cache
        start_use_stop(make, use)
    # In turns, so that the VM's drift touches every row alike.
    for _ in range(reps):
        for name, make, use in rows:
            times[name].append(start_use_stop(make, use))
    print(f"\nstarting a pool of {w} workers, its first trivial result, shutting it down "
          f"(median of {reps}, in turns)")
    print("| pool | time | vs pymizu.Pool |")
    print("|---|---:|---:|")
    base = statistics.median(times["pymizu.Pool"])
    for name, _, _ in rows:
        m = statistics.median(times[name])
        print(f"| {name} | {m * 1e3:.1f} ms | {m / base:.2f}x |")
    import subprocess

    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    bare = time.perf_counter() - t
    print(f"for scale: starting a bare interpreter (`{os.path.basename(sys.executable)} -c pass`) "
          f"and waiting for it took {bare * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
