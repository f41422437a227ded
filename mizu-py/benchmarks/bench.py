"""pymizu against the Python peers, same machine, same run, same work.

`python mizu-py/benchmarks/bench.py [--quick] [--workers N]` (run by `cargo xtask bench`;
`cargo xtask demo` runs it with --quick). Peers: concurrent.futures.ProcessPoolExecutor,
ThreadPoolExecutor, multiprocessing.Pool and loky. Every number is the median of several
runs; ratios are peer time / pymizu time (higher: pymizu faster). The round-trip and pipelined
rows of `pymizu.Pool` and `pymizu.PoolExecutor` are medians over nine rounds alternating the two
(each round's values are printed too).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import pymizu  # noqa: E402
import work  # noqa: E402
from timing import pool_args, timed  # noqa: E402


# Rounds of pymizu.Pool and pymizu.PoolExecutor in alternation for the first two rows.
ALTERNATIONS = 9


# A lambda: its qualified name says workers cannot import it (see `Peer.unimportable`).
_UNIMPORTABLE = lambda x: work.add(x, 1)  # noqa: E731


class Peer:
    """One pool behind a common interface."""

    def __init__(self, name, pool, kind, workers=None):
        self.name, self.pool, self.kind = name, pool, kind
        if workers:
            # Rows measure pools whose workers run: executors that start workers as work
            # needs them (ProcessPoolExecutor, PoolExecutor, loky) start them all here, and
            # every worker imports what the rows use, outside the measures.
            if kind == "mp":
                for r in [pool.apply_async(work.warm, (0.3,)) for _ in range(workers)]:
                    r.get()
            else:
                for f in [pool.submit(work.warm, 0.3) for _ in range(workers)]:
                    f.result()

    def call(self, fn, *args):
        if self.kind == "mp":
            return self.pool.apply_async(fn, args).get()
        return self.pool.submit(fn, *args).result()

    def round_trips(self, fn, k):
        """`k` round trips of `fn(1, 1)` one after another, written as a user's loop would be
        (the bound method in a local), so that no layer of the harness sits in the measure."""
        if self.kind == "mp":
            apply = self.pool.apply_async
            for _ in range(k):
                apply(fn, (1, 1)).get()
        else:
            submit = self.pool.submit
            for _ in range(k):
                submit(fn, 1, 1).result()

    def made_per_call(self, how, k):
        """`k` round trips of a call made anew each time, as a loop or a coroutine makes them:
        `partial(work.add, i, 1)` or `lambda: work.add(i, 1)`. None where the pool cannot
        send it (a lambda through plain pickle)."""
        if how == "partial":
            make = lambda i: functools.partial(work.add, i, 1)  # noqa: E731
        else:
            make = lambda i: lambda: work.add(i, 1)  # noqa: E731
        try:
            if self.kind == "mp":
                apply = self.pool.apply_async
                for i in range(k):
                    apply(make(i)).get()
            else:
                submit = self.pool.submit
                for i in range(k):
                    submit(make(i)).result()
        except Exception:
            return None
        return True

    def unimportable(self, k):
        """`k` round trips of one lambda made beforehand, as a notebook, a REPL or a script
        without a `__main__` guard defines every function: workers cannot import it. None
        where the pool cannot send it (plain pickle)."""
        f = _UNIMPORTABLE
        try:
            if self.kind == "mp":
                apply = self.pool.apply_async
                for i in range(k):
                    apply(f, (i,)).get()
            else:
                submit = self.pool.submit
                for i in range(k):
                    submit(f, i).result()
        except Exception:
            return None
        return True

    def pairs(self, us, k):
        """`k` rounds of two `spin` tasks of `us` µs submitted together, then both results
        taken (each worker gets one): a burst smaller than the pool's workers, as a caller
        that fans out a few calls at a time makes."""
        if self.kind == "mp":
            apply = self.pool.apply_async
            for i in range(k):
                a, b = apply(work.spin, (i, us)), apply(work.spin, (i, us))
                a.get()
                b.get()
        else:
            submit = self.pool.submit
            for i in range(k):
                a, b = submit(work.spin, i, us), submit(work.spin, i, us)
                a.result()
                b.result()

    def pipelined(self, fn, n):
        if self.kind == "mp":
            rs = [self.pool.apply_async(fn, (i, 1)) for i in range(n)]
            return [r.get() for r in rs]
        fs = [self.pool.submit(fn, i, 1) for i in range(n)]
        return [f.result() for f in fs]

    def pipelined_batch(self, fn, n):
        """`pipelined` through the pool's batch API where it has one (`Pool.submit_batch` +
        `collect_all`: one queue publication per run of calls, small calls written natively)."""
        if self.kind == "mizu":
            return self.pool.collect_all(self.pool.submit_batch(fn, [(i, 1) for i in range(n)]))
        return self.pipelined(fn, n)

    def map(self, fn, xs, chunksize):
        if self.kind == "mizu":
            return self.pool.map(fn, xs)
        if self.kind == "mp":
            return self.pool.map(fn, xs, chunksize)
        return list(self.pool.map(fn, xs, chunksize=chunksize))

    def close(self):
        if self.kind == "mp":
            self.pool.terminate()
        elif self.kind == "mizu":
            self.pool.stop()
        else:
            self.pool.shutdown()




def _array_rt(arr, k, q):
    """Steady-state round trip of `arr` (sent and returned), `k` calls per run."""
    k = max(2, int(k * q))
    return lambda p: timed(lambda: [p.call(work.ident, arr) for _ in range(k)], 5, k) * 1e6


def _made_per_call(how, q):
    """Round trip of a call made anew each time (`Peer.made_per_call`); None where the pool
    cannot send it."""
    return _calls(lambda p, k: p.made_per_call(how, k), q)


def _calls(run, q):
    """Round trip of one of `run(peer, k)`'s `k` calls; None where the pool cannot send them."""
    k = int(300 * q) or 1

    def measure(p):
        if run(p, 1) is None:
            return None
        return timed(lambda: run(p, k), 5, k) * 1e6

    return measure


def line_floor() -> float | None:
    """Nanoseconds for one cache line's round trip between CPUs 0 and 1 now (None on one CPU)."""
    try:
        return pymizu._native.line_round_trip_ns(0, 1)
    except pymizu.MizuError:
        return None


def shm_capacity() -> int:
    """Bytes /dev/shm holds (or MIZU_SHM_BYTES, when smaller): what pymizu's payloads live in."""
    try:
        st = os.statvfs("/dev/shm")
        cap = st.f_blocks * st.f_frsize
    except OSError:
        cap = 1 << 62
    lim = os.environ.get("MIZU_SHM_BYTES", "").strip()
    return min(cap, int(lim)) if lim.isdigit() else cap


def write_results(path, workers, quick, floors, names, measures, table):
    """The run's results as JSON (`cargo xtask bench` sets MIZU_BENCH_JSON; `charts.py` draws
    them): per measure its unit, which way is better, and every peer's value."""
    import datetime
    import json
    import platform

    doc = {
        "language": "python",
        "title": "pymizu vs Python peers",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "workers": workers,
        "quick": quick,
        "floor_ns": [f for f in floors if f is not None],
        "round_trip": "trivial round trip",
        "throughput": "pipelined, 5000 tasks",
        "rows": [
            {
                "measure": name,
                "unit": unit,
                "higher_is_better": unit.startswith("k tasks"),
                "values": {n: table[(n, name)] for n in names},
            }
            for name, unit, _ in measures
        ],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main():
    a = pool_args()
    w = a.workers
    q = 0.25 if a.quick else 1.0

    import loky

    # One pool at a time: idle workers of another pool would compete for the 2 CPUs.
    peers = [
        ("pymizu.Pool", lambda: pymizu.Pool(w), "mizu"),
        ("pymizu.PoolExecutor", lambda: pymizu.PoolExecutor(w), "exec"),
        ("ProcessPoolExecutor", lambda: ProcessPoolExecutor(w), "exec"),
        ("multiprocessing.Pool", lambda: multiprocessing.Pool(w), "mp"),
        ("loky", lambda: loky.get_reusable_executor(max_workers=w), "exec"),
        ("ThreadPoolExecutor", lambda: ThreadPoolExecutor(w), "exec"),
    ]
    arrays = {s: np.random.default_rng(0).random(n) for s, n in [("8 KB", 1024), ("800 KB", 102_400), ("8 MB", 1_048_576)]}
    # 50 MB, or an eighth of a small /dev/shm (a container's default 64 MiB cannot hold two
    # 50 MB frames next to the pools' own segments).
    cap = shm_capacity()
    frame_mb = 50 if cap >= 1 << 30 else max(1, cap // 8 // 1_000_000)
    if frame_mb < 50:
        print(f"note: /dev/shm holds {cap / 1e6:.0f} MB: the frame row uses a {frame_mb} MB frame "
              "(give /dev/shm 1 GB, e.g. `docker run --shm-size=1g`, for the full 50 MB)")
    frame = pd.DataFrame({f"c{i}": np.random.default_rng(i).random(frame_mb * 26_215) for i in range(5)})
    n_map = 10_000
    xs = list(range(n_map))
    chunk = max(1, n_map // (4 * w))
    spin_xs = list(range(2000))
    measures = [
        # More repetitions than the others: a short stall (a collection, the VM) moves a
        # microsecond-scale median.
        ("trivial round trip", "us", lambda p: timed(lambda: p.round_trips(work.add, int(500 * q) or 1), 9, int(500 * q) or 1) * 1e6),
        ("pipelined, 5000 tasks", "k tasks/s", lambda p: 5000 / timed(lambda: p.pipelined(work.add, 5000), 3, most=15) / 1e3),
        ("pipelined batch, 5000 tasks", "k tasks/s", lambda p: 5000 / timed(lambda: p.pipelined_batch(work.add, 5000), 3, most=15) / 1e3),
        *[
            (f"{s} float64 array round trip", "us", _array_rt(arr, k, q))
            for (s, arr), k in zip(arrays.items(), (100, 40, 10))
        ],
        *[
            (f"round trip, {how} made per call", "us", _made_per_call(how, q))
            for how in ("partial", "lambda")
        ],
        ("round trip, a function workers cannot import", "us", _calls(Peer.unimportable, q)),
        ("two 25 us tasks at once", "us", lambda p: timed(lambda: p.pairs(25, int(200 * q) or 1), 5, int(200 * q) or 1) * 1e6),
        ("map 10 000 trivial", "us/elem", lambda p: timed(lambda: p.map(work.ident, xs, chunk), 3) / n_map * 1e6),
        ("map 2 000 x 5 us tasks", "ms", lambda p: timed(lambda: p.map(work.spin, spin_xs, max(1, 2000 // (4 * w))), 3) * 1e3),
        (f"{frame_mb} MB pandas frame argument", "ms", lambda p: timed(lambda: p.call(work.nrows, frame), 3) * 1e3),
    ]
    table = {}
    floors = [line_floor()]
    # pymizu's two front ends differ by a fraction of a microsecond per task, while this VM's
    # speed drifts by up to 2x from one minute to the next: their round-trip and pipelined
    # rows are medians over rounds that alternate the two (a fresh pool each round).
    alternated = measures[:2]
    rounds = {}
    n_rounds = 1 if a.quick else ALTERNATIONS
    for _ in range(n_rounds):
        for pname, make, kind in peers[:2]:
            p = Peer(pname, make(), kind, w)
            for name, unit, f in alternated:
                rounds.setdefault((pname, name), []).append(f(p))
            p.close()
            time.sleep(0.2)
    for key, vals in rounds.items():
        table[key] = statistics.median(vals)
        if n_rounds > 1:
            print(f"rounds of {key[0]}, {key[1]}: " + ", ".join(f"{v:.2f}" for v in vals))
    for pname, make, kind in peers:
        p = Peer(pname, make(), kind, w)
        for name, unit, f in measures:
            if (pname, name) not in table:
                table[(pname, name)] = f(p)
        p.close()
        if pname == "pymizu.Pool":
            floors.append(line_floor())
        time.sleep(0.5)
    names = [p[0] for p in peers]
    print(f"\npymizu vs Python peers: {w} workers each, {os.cpu_count()} CPUs, median of runs "
          f"(pymizu's first two rows: of {n_rounds} round{'s' * (n_rounds != 1)} alternating Pool and PoolExecutor)")
    head = f"| {'measure':<30} | {'unit':<9} | " + " | ".join(f"{n:>20}" for n in names) + " | vs PPE | vs best process peer |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    def ratio(v, peer, higher_better):
        if v is None or peer is None:
            return "n/a"
        return f"{(v / peer if higher_better else peer / v):.1f}x"

    for name, unit, _ in measures:
        vals = [table[(n, name)] for n in names]
        higher_better = unit.startswith("k tasks")
        mizu = vals[0]
        ppe = table[("ProcessPoolExecutor", name)]
        # (A peer that cannot send a row's call has no value: a lambda through plain pickle.)
        procs = [v for n in ("ProcessPoolExecutor", "multiprocessing.Pool", "loky") if (v := table[(n, name)]) is not None]
        best = (max(procs) if higher_better else min(procs)) if procs else None
        cells = " | ".join(f"{'n/a':>20}" if v is None else f"{v:>20.2f}" for v in vals)
        print(f"| {name:<30} | {unit:<9} | {cells} | {ratio(mizu, ppe, higher_better):>6} | "
              f"{ratio(mizu, best, higher_better):>20} |")
    results = os.environ.get("MIZU_BENCH_JSON")
    if results:
        write_results(results, w, a.quick, floors, names, measures, table)
    if all(f is not None for f in floors):
        rt = table[("pymizu.Pool", "trivial round trip")] * 1e3
        print(
            f"machine floor: one cache line's round trip between cpu0 and cpu1 took {floors[0]:.0f} ns "
            f"before pymizu's first row and {floors[1]:.0f} ns after pymizu.Pool's last (no shared-memory round trip can "
            f"be faster; on this VM it moves between ~100 and ~400 ns with the host's placement); "
            f"pymizu.Pool's trivial round trip is {rt / (sum(floors) / 2):.1f} of them"
        )


if __name__ == "__main__":
    main()
