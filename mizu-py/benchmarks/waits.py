"""How fast a completion reaches each way of waiting, pymizu against ProcessPoolExecutor.

`python mizu-py/benchmarks/waits.py [--quick]` (run by `cargo xtask bench`, and with --quick
by the demo). For a trivial task, per task: `.result()`, `as_completed`, `wait(FIRST_COMPLETED)`,
a done-callback, `await asyncio.wrap_future(...)`, `await loop.run_in_executor(...)` and, for
`pymizu.Pool`, `await task`; then the same for a task that runs 1 ms, shown as the time past
that millisecond. asyncio's own cost of awaiting an already finished future is printed too:
no executor's asyncio rows can be below it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

import pymizu  # noqa: E402
import work  # noqa: E402


def per_task(f, n, reps):
    f(max(5, n // 10))  # warm-up
    return statistics.median([f(n) for _ in range(reps)])


def paths(ex, fn, args, n, reps):
    def result(k):
        t = time.perf_counter()
        for _ in range(k):
            ex.submit(fn, *args).result()
        return (time.perf_counter() - t) / k

    def completed(k):
        t = time.perf_counter()
        for _ in range(k):
            for f in as_completed([ex.submit(fn, *args)]):
                f.result()
        return (time.perf_counter() - t) / k

    def waited(k):
        t = time.perf_counter()
        for _ in range(k):
            wait([ex.submit(fn, *args)], return_when=FIRST_COMPLETED)
        return (time.perf_counter() - t) / k

    def callback(k):
        ev = threading.Event()
        t = time.perf_counter()
        for _ in range(k):
            ev.clear()
            ex.submit(fn, *args).add_done_callback(lambda _f: ev.set())
            ev.wait()
        return (time.perf_counter() - t) / k

    def wrapped(k):
        async def go():
            t = time.perf_counter()
            for _ in range(k):
                await asyncio.wrap_future(ex.submit(fn, *args))
            return (time.perf_counter() - t) / k

        return asyncio.run(go())

    def in_executor(k):
        async def go():
            loop = asyncio.get_running_loop()
            t = time.perf_counter()
            for _ in range(k):
                await loop.run_in_executor(ex, fn, *args)
            return (time.perf_counter() - t) / k

        return asyncio.run(go())

    rows = [
        (".result()", result),
        ("as_completed", completed),
        ("wait(FIRST_COMPLETED)", waited),
        ("add_done_callback", callback),
        ("await wrap_future", wrapped),
        ("await run_in_executor", in_executor),
    ]
    return {name: per_task(f, n, reps) for name, f in rows}


def await_pool(pool, fn, args, n, reps):
    def go(k):
        async def inner():
            t = time.perf_counter()
            for _ in range(k):
                await pool.submit(fn, *args)
            return (time.perf_counter() - t) / k

        return asyncio.run(inner())

    return per_task(go, n, reps)


def asyncio_floor(n):
    """asyncio's own cost of awaiting a concurrent future that is already finished."""

    async def go():
        f = Future()
        f.set_result(1)
        t = time.perf_counter()
        for _ in range(n):
            await asyncio.wrap_future(f)
        return (time.perf_counter() - t) / n

    return asyncio.run(go())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    q = 0.25 if a.quick else 1.0
    n, reps = max(50, int(400 * q)), 3 if a.quick else 5
    n_long = max(20, int(100 * q))
    table = {}
    for name, make in [("pymizu.PoolExecutor", lambda: pymizu.PoolExecutor(2)), ("ProcessPoolExecutor", lambda: ProcessPoolExecutor(2))]:
        ex = make()
        k = n if name.startswith("pymizu") else max(20, n // 10)
        table[name] = paths(ex, work.add, (1, 1), k, reps)
        long = paths(ex, work.spin, (0, 1000.0), n_long, reps)
        for row, v in long.items():
            table[name][row + " (1 ms task, time past 1 ms)"] = v - 1e-3
        ex.shutdown()
        time.sleep(0.3)
    with pymizu.Pool(2) as p:
        table["pymizu.PoolExecutor"]["await task (pymizu.Pool)"] = await_pool(p, work.add, (1, 1), n, reps)
        table["pymizu.PoolExecutor"]["await task (pymizu.Pool) (1 ms task, time past 1 ms)"] = (
            await_pool(p, work.spin, (0, 1000.0), n_long, reps) - 1e-3
        )
    rows = list(table["pymizu.PoolExecutor"])
    print("\nA completion reaching each way of waiting: 2 workers, time per task (median of runs)")
    print("| way of waiting | pymizu | ProcessPoolExecutor | ratio |")
    print("|---|---:|---:|---:|")
    for r in rows:
        m = table["pymizu.PoolExecutor"][r]
        p = table["ProcessPoolExecutor"].get(r.replace("await task (pymizu.Pool)", "await wrap_future"))
        ratio = f"{p / m:.0f}x" if p and m > 0 else ""
        ps = f"{p * 1e6:.1f} us" if p else ""
        print(f"| {r} | {m * 1e6:.1f} us | {ps} | {ratio} |")
    print(f"asyncio's own floor (awaiting an already finished concurrent future): {asyncio_floor(2000) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
