"""Compute-bound maps at the machine's limit: how close each pool's map comes to the ideal —
the map's own sequential time, measured in the same run, divided by the workers — with tasks of
5 us, 50 us and 1 ms of computation (`work.burn`, calibrated at the start: a task takes longer
when anything else takes its CPU, as real work does), and a skewed map (every hundredth element
costs 100x). Efficiency is ideal / achieved (100%: the workers never wait and nothing else
takes their CPUs). A pymizu row below its target — 90% of the ideal (85% for the skewed map)
and ahead of every peer — is printed as BEHIND TARGET (a report, not a failure).

    python mizu-py/benchmarks/maps.py [--quick] [--workers N]

The first row is a reference for the machine: forked processes that each run a fixed share of
the elements, with nothing sent but "go" and "done" (see `Shares`). Each pool maps as its
users call it, with its default chunking: `pymizu.Pool.map`, `pymizu.Pool.imap_unordered`,
`pymizu.PoolExecutor.map`, `multiprocessing.Pool.map` and `imap_unordered`, loky's and
`ProcessPoolExecutor`'s `map` (chunksize 1 by default; also shown
with multiprocessing's chunking). Every number is the median of several runs.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

import pymizu  # noqa: E402
import work  # noqa: E402
from timing import pool_args  # noqa: E402

#: The row of forked processes that each run a fixed share of a map (see `Shares`).
MACHINE = "forked processes, fixed shares"


def mp_chunksize(n, w):
    """multiprocessing.Pool.map's default chunk size."""
    c, extra = divmod(n, w * 4)
    return c + bool(extra)


class Shares:
    """A reference for the machine: `w` processes forked beforehand, each running one
    contiguous share of the elements when told to and answering one byte — no task machinery,
    nothing serialized, no results. It shows what this machine and its scheduler give processes
    that do nothing but the work, in the same minute as the pools. A pool can do better (these
    shares are fixed, and nothing moves two of them the kernel put on one CPU), but a pool far
    below it loses to its own machinery."""

    def __init__(self, w):
        self.kids = []
        for i in range(w):
            go_r, go_w = os.pipe()
            done_r, done_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                # (The ends of the shares forked before this one are theirs: a copy kept here
                # would keep their pipes open after `stop`.)
                for _, go, done in self.kids:
                    os.close(go)
                    os.close(done)
                os.close(go_w)
                os.close(done_r)
                while True:
                    msg = os.read(go_r, 64)
                    if not msg:
                        os._exit(0)
                    skewed, k, n = map(int, msg.split())
                    fn = work.burn_skewed if skewed else work.burn
                    for x in range(n * i // w, n * (i + 1) // w):
                        fn(x, k)
                    os.write(done_w, b".")
            os.close(go_r)
            os.close(done_w)
            self.kids.append((pid, go_w, done_r))

    def run(self, fn, xs, k):
        msg = f"{int(fn is work.burn_skewed)} {k} {len(xs)}".encode()
        for _, go, _ in self.kids:
            os.write(go, msg)
        for _, _, done in self.kids:
            if os.read(done, 1) != b".":
                raise RuntimeError("a forked share died")

    def stop(self):
        for pid, go, done in self.kids:
            os.close(go)
            os.close(done)
            os.waitpid(pid, 0)


def main():
    a = pool_args()
    w = a.workers
    # Quick: fewer pairs, the same maps (a map a quarter as long weighs a map's fixed costs
    # four times, and three pairs leave a row's median to one unlucky run).
    reps = 5 if a.quick else 15
    # (row, function, burn rounds per element, elements): about 40 ms of work each.
    scale = 1.0
    rows = [
        ("5 us tasks", work.burn, work.rounds_for(5.0), int(8000 * scale)),
        ("50 us tasks", work.burn, work.rounds_for(50.0), int(800 * scale)),
        ("1 ms tasks", work.burn, work.rounds_for(1000.0), int(40 * scale) or 4),
        ("skewed (1% cost 100x)", work.burn_skewed, work.rounds_for(5.0), int(4000 * scale)),
    ]
    import loky

    pools = [
        (MACHINE, lambda: Shares(w), lambda p, fn, xs, k: p.run(fn, xs, k)),
        ("pymizu.Pool.map", lambda: pymizu.Pool(w), lambda p, fn, xs, k: p.map(fn, xs, [k] * len(xs))),
        ("pymizu.Pool.imap_unordered", lambda: pymizu.Pool(w),
         lambda p, fn, xs, k: list(p.imap_unordered(fn, xs, [k] * len(xs)))),
        ("pymizu.PoolExecutor.map", lambda: pymizu.PoolExecutor(w),
         lambda p, fn, xs, k: list(p.map(fn, xs, [k] * len(xs)))),
        ("multiprocessing.Pool.map", lambda: multiprocessing.Pool(w),
         lambda p, fn, xs, k: p.starmap(fn, [(x, k) for x in xs])),
        ("multiprocessing imap_unordered", lambda: multiprocessing.Pool(w),
         lambda p, fn, xs, k: list(p.imap_unordered(work.burn_pair if fn is work.burn else work.burn_skewed_pair,
                                                     [(x, k) for x in xs], mp_chunksize(len(xs), w)))),
        ("ProcessPoolExecutor.map", lambda: ProcessPoolExecutor(w),
         lambda p, fn, xs, k: list(p.map(fn, xs, [k] * len(xs)))),
        ("ProcessPoolExecutor, mp chunks", lambda: ProcessPoolExecutor(w),
         lambda p, fn, xs, k: list(p.map(fn, xs, [k] * len(xs), chunksize=mp_chunksize(len(xs), w)))),
        ("loky", lambda: loky.get_reusable_executor(max_workers=w),
         lambda p, fn, xs, k: list(p.map(fn, xs, [k] * len(xs)))),
    ]
    # This VM's speed drifts by up to 2x from one minute to the next: each map run is paired
    # with a sequential run just before it, and a row's efficiency is the median over the
    # pairs of (sequential / workers) / map.
    table, eff, ideal = {}, {}, {}
    for pname, make, run in pools:
        p = make()
        # Rows measure pools whose workers run: executors that start workers as work needs
        # them (ProcessPoolExecutor, PoolExecutor, loky) start them all here, outside the
        # measures (a worker still starting takes a CPU from the map).
        if isinstance(p, Shares):
            pass
        elif hasattr(p, "apply_async"):
            for r in [p.apply_async(work.warm, (0.3,)) for _ in range(w)]:
                r.get()
        else:
            for f in [p.submit(work.warm, 0.3) for _ in range(w)]:
                f.result()
        for name, fn, k, n in rows:
            xs = list(range(n))
            got = run(p, fn, xs, k)
            assert pname == MACHINE or sorted(got) == xs, f"{pname} {name}: wrong results"
            pairs = []
            for _ in range(reps):
                t = time.perf_counter()
                [fn(x, k) for x in xs]
                seq = time.perf_counter() - t
                t = time.perf_counter()
                run(p, fn, xs, k)
                pairs.append((seq / w, time.perf_counter() - t))
            table[(pname, name)] = statistics.median(m for _, m in pairs)
            eff[(pname, name)] = statistics.median(i / m for i, m in pairs)
            ideal.setdefault(name, []).extend(i for i, _ in pairs)
        if hasattr(p, "stop"):
            p.stop()
        elif hasattr(p, "terminate"):
            p.terminate()
        else:
            p.shutdown()
        time.sleep(0.3)
    ideal = {name: statistics.median(v) for name, v in ideal.items()}
    print(f"\ncompute-bound maps: {w} workers, {os.cpu_count()} CPUs, median of {reps} runs; "
          "efficiency = median over runs of (sequential time / workers) / time, each map run "
          "paired with a sequential run just before it")
    head = f"| {'map':<32} | " + " | ".join(f"{r[0]:>22}" for r in rows) + " |"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    print(f"| {'ideal (sequential / workers)':<32} | "
          + " | ".join(f"{ideal[r[0]] * 1e3:>19.2f} ms" for r in rows) + " |")
    for pname, _, _ in pools:
        cells = []
        for r in rows:
            t = table[(pname, r[0])]
            cells.append(f"{t * 1e3:>8.2f} ms {eff[(pname, r[0])]:>6.0%}")
        print(f"| {pname:<32} | " + " | ".join(f"{c:>22}" for c in cells) + " |")
    mizu = [p[0] for p in pools if p[0].startswith("pymizu")]
    peers = [p[0] for p in pools if not p[0].startswith("pymizu") and p[0] != MACHINE]
    behind = []
    for r in rows:
        best_peer = max(peers, key=lambda q: eff[(q, r[0])])
        effs = ", ".join(f"{m.split('.', 1)[1]} {eff[(m, r[0])]:.0%}" for m in mizu)
        print(f"{r[0]}: pymizu {effs}; best peer {best_peer} {eff[(best_peer, r[0])]:.0%}; "
              f"forked fixed shares {eff[(MACHINE, r[0])]:.0%}")
        # The targets: 90% of the ideal (85% for the skewed map), and ahead of every peer.
        want = 0.85 if r[0].startswith("skewed") else 0.90
        for m in mizu:
            e = eff[(m, r[0])]
            if e < want or e < eff[(best_peer, r[0])]:
                behind.append(f"{m} on {r[0]}: {e:.0%} (target {want:.0%}, best peer {eff[(best_peer, r[0])]:.0%})")
    for b in behind:
        print(f"BEHIND TARGET: {b}")


if __name__ == "__main__":
    main()
