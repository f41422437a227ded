"""How fast a completion reaches each way of waiting, pymizu against ProcessPoolExecutor.

`python mizu-py/benchmarks/waits.py [--quick]` (run by `cargo xtask bench`, and with --quick
by the demo). For a trivial task, per task: `.result()`, `as_completed`, `wait(FIRST_COMPLETED)`,
a done-callback, `await asyncio.wrap_future(...)`, `await loop.run_in_executor(...)` and, for
`pymizu.Pool`, `await task`; then the same for a task that runs 1 ms, shown as the time past
that millisecond; then many tasks submitted at once and waited for each way, beside
`ThreadPoolExecutor` (no process at all: what the standard library's and asyncio's own
bookkeeping of a future costs). asyncio's own hand-over of a plain concurrent future, as it
goes for any executor's (`call_soon_threadsafe`, whose wake-up write the loop reads back), is
printed too, for reference: pymizu's futures hand their outcome to a loop in its own thread
without that write.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed, wait

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


def reach(ex, pool, us, n):
    """Median time from the worker finishing a `us` µs task to each way of waiting having its
    outcome (`pool`: also `await task` on a `pymizu.Pool`)."""
    fn = work.spin_stamp

    def result():
        v = ex.submit(fn, us).result()
        return time.perf_counter() - v

    def completed():
        for f in as_completed([ex.submit(fn, us)]):
            return time.perf_counter() - f.result()

    def waited():
        f = ex.submit(fn, us)
        wait([f], return_when=FIRST_COMPLETED)
        return time.perf_counter() - f.result()

    def callback():
        ev, box = threading.Event(), []
        f = ex.submit(fn, us)
        f.add_done_callback(lambda _f: (box.append(time.perf_counter()), ev.set()))
        ev.wait()
        return box[0] - f.result()

    def looped(make):
        async def go():
            out = []
            for _ in range(n + 2):
                v = await make()
                out.append(time.perf_counter() - v)
            return statistics.median(out[2:])

        return asyncio.run(go())

    out = {}
    for name, f in [(".result()", result), ("as_completed", completed), ("wait(FIRST_COMPLETED)", waited), ("add_done_callback", callback)]:
        f(), f()
        out[name] = statistics.median([f() for _ in range(n)])
    out["await wrap_future"] = looped(lambda: asyncio.wrap_future(ex.submit(fn, us)))
    out["await run_in_executor"] = looped(lambda: asyncio.get_running_loop().run_in_executor(ex, fn, us))
    if pool is not None:
        out["await task (pymizu.Pool)"] = looped(lambda: pool.submit(fn, us))
    return out


def wake_floor(n):
    """A thread asleep in the kernel (blocked on a pipe) woken by another process that has just
    spun 1 ms: the cost every waiter that sleeps pays once the worker finishes."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        for _ in range(n):
            work.spin_stamp(1000.0)
            os.write(w, repr(time.perf_counter()).encode().ljust(32))
        os._exit(0)
    os.close(w)
    out = []
    for _ in range(n):
        sent = float(os.read(r, 32))
        out.append(time.perf_counter() - sent)
    os.close(r)
    os.waitpid(pid, 0)
    return statistics.median(out)


def loop_floor(n, busy_us=0.0):
    """asyncio's own cost from a concurrent future set in the loop's thread to the coroutine
    awaiting it running again; with `busy_us`, each time after the thread spent that long on
    other work (as when a task finishes, by when the loop's code may have left the CPU's
    caches)."""

    async def go():
        loop = asyncio.get_running_loop()
        out, box = [], [0.0]

        def fire(f):
            if busy_us:
                work.spin_stamp(busy_us)
            box[0] = time.perf_counter()
            f.set_result(None)

        for _ in range(n):
            f = Future()
            aw = asyncio.wrap_future(f)
            loop.call_soon(fire, f)
            await aw
            out.append(time.perf_counter() - box[0])
        return statistics.median(out)

    return asyncio.run(go())


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


def bulk(ex, n, reps):
    """Per task, median of `reps`: `n` trivial tasks submitted at once, then waited for each
    way a program waits for many."""

    def results():
        fs = [ex.submit(work.add, i, 1) for i in range(n)]
        for f in fs:
            f.result()

    def completed():
        for _ in as_completed([ex.submit(work.add, i, 1) for i in range(n)]):
            pass

    def waited():
        wait([ex.submit(work.add, i, 1) for i in range(n)])

    def callbacks():
        done, left = threading.Event(), [n]
        lock = threading.Lock()

        def one(_f):
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        for i in range(n):
            ex.submit(work.add, i, 1).add_done_callback(one)
        done.wait()

    def gathered():
        async def go():
            loop = asyncio.get_running_loop()
            await asyncio.gather(*[loop.run_in_executor(ex, work.add, i, 1) for i in range(n)])

        asyncio.run(go())

    rows = {
        "`.result()` of each": results,
        "`as_completed`": completed,
        "`wait` (all)": waited,
        "`add_done_callback`": callbacks,
        "`asyncio.gather` of `run_in_executor`": gathered,
    }
    out = {}
    for name, f in rows.items():
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            times.append((time.perf_counter() - t) / n)
        out[name] = statistics.median(times)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    q = 0.25 if a.quick else 1.0
    n, reps = max(50, int(400 * q)), 3 if a.quick else 5
    n_long = max(20, int(100 * q))
    table, reached = {}, {}
    for name, make in [("pymizu.PoolExecutor", lambda: pymizu.PoolExecutor(2)), ("ProcessPoolExecutor", lambda: ProcessPoolExecutor(2))]:
        ex = make()
        k = n if name.startswith("pymizu") else max(20, n // 10)
        table[name] = paths(ex, work.add, (1, 1), k, reps)
        if name.startswith("pymizu"):
            with pymizu.Pool(2) as p:
                table[name]["await task (pymizu.Pool)"] = await_pool(p, work.add, (1, 1), n, reps)
                reached[name] = reach(ex, p, 1000.0, n_long)
        else:
            reached[name] = reach(ex, None, 1000.0, n_long)
        ex.shutdown()
        time.sleep(0.3)

    def show(title, t):
        print(title)
        print("| way of waiting | pymizu | ProcessPoolExecutor | ratio |")
        print("|---|---:|---:|---:|")
        for r, m in t["pymizu.PoolExecutor"].items():
            p = t["ProcessPoolExecutor"].get(r.replace("await task (pymizu.Pool)", "await wrap_future"))
            ratio = f"{p / m:.0f}x" if p and m > 0 else ""
            ps = f"{p * 1e6:.1f} us" if p else ""
            print(f"| {r} | {m * 1e6:.1f} us | {ps} | {ratio} |")

    show("\nA completion reaching each way of waiting: 2 workers, trivial task, time per task with its submit (median of runs)", table)
    show("\nA 1 ms task on an idle pool: from the worker finishing to the waiter having the outcome (median)", reached)
    n_bulk = 1000 if a.quick else 5000
    many = {}
    for name, make in [("pymizu.PoolExecutor", lambda: pymizu.PoolExecutor(2)), ("ProcessPoolExecutor", lambda: ProcessPoolExecutor(2)), ("ThreadPoolExecutor", lambda: ThreadPoolExecutor(2))]:
        ex = make()
        ex.submit(work.add, 1, 1).result()
        many[name] = bulk(ex, n_bulk if name != "ProcessPoolExecutor" else n_bulk // 5, 3)
        ex.shutdown()
        time.sleep(0.3)
    print(f"\n{n_bulk} trivial tasks submitted at once, then waited for ({n_bulk // 5} for ProcessPoolExecutor): per task, submit included (median of 3)")
    print("| way of waiting | pymizu | ProcessPoolExecutor | ThreadPoolExecutor | vs ProcessPoolExecutor |")
    print("|---|---:|---:|---:|---:|")
    for r, m in many["pymizu.PoolExecutor"].items():
        p, t = many["ProcessPoolExecutor"][r], many["ThreadPoolExecutor"][r]
        print(f"| {r} | {m * 1e6:.1f} us | {p * 1e6:.1f} us | {t * 1e6:.1f} us | {p / m:.0f}x |")
    print(f"The machine's floor: a sleeping thread woken by another process {wake_floor(n_long) * 1e6:.1f} us. "
          f"asyncio's own hand-over of a plain concurrent future: set in the loop's thread, the coroutine "
          f"awaiting it resumes after {loop_floor(2000) * 1e6:.1f} us "
          f"({loop_floor(n_long, 1000.0) * 1e6:.1f} us after 1 ms of other work); "
          f"awaiting one already finished {asyncio_floor(2000) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
