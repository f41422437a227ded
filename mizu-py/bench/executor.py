"""pymizu.PoolExecutor against concurrent.futures.ProcessPoolExecutor, same run, same work.

`python mizu-py/bench/executor.py [workers]` (run by `cargo xtask demo` and `cargo xtask bench`).
"""

import operator
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pymizu


def round_trip(ex, n):
    ex.submit(operator.add, 1, 1).result()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            ex.submit(operator.add, 1, 1).result()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def mapped(ex, n):
    list(ex.map(operator.add, range(100), range(100)))
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        list(ex.map(operator.add, range(n), range(n)))
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def main():
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with pymizu.PoolExecutor(workers) as m, ProcessPoolExecutor(workers) as p:
        rows = [
            ("submit + result() round trip (us)", round_trip(m, 5000), round_trip(p, 2000)),
            ("Executor.map, per element (us)", mapped(m, 20000), mapped(p, 20000)),
        ]
    print(f"pymizu.PoolExecutor vs ProcessPoolExecutor, {workers} worker(s) each, operator.add, median of runs")
    print("| measure                            |   pymizu | ProcessPoolExecutor | pymizu faster by |")
    print("|------------------------------------|---------:|--------------------:|-----------------:|")
    for name, a, b in rows:
        print(f"| {name:<34} | {a:>8.1f} | {b:>19.1f} | {b / a:>15.1f}x |")


if __name__ == "__main__":
    main()
