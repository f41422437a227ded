"""One big input read by many tasks: pymizu with `share()` (and a map's repeated argument,
shared automatically) against passing it each time, joblib (which memory-maps large arrays
by itself, through loky) and ProcessPoolExecutor — in one run, 2 workers each.

    python mizu-py/benchmarks/share.py [--quick]

(Part of `cargo xtask bench`.)
"""

from __future__ import annotations

import argparse
import statistics
import itertools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pymizu  # noqa: E402
import work  # noqa: E402
from timing import peer_timed, timed  # noqa: E402




def alternated(f, g, reps):
    """Median seconds of `f()` and of `g()` over `reps` calls each, made in alternation after a
    warm-up call of each."""
    f(), g()
    a, b = [], []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        g()
        b.append(time.perf_counter() - t)
    return statistics.median(a), statistics.median(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    reps = 3 if a.quick else 5
    w = 2
    big = np.random.default_rng(0).random(10_000_000)  # 80 MB
    n_tasks, n_map = 100, 200
    rows = {}

    with pymizu.Pool(w) as p:
        t = time.perf_counter()
        shared = pymizu.share(big)
        share_once = time.perf_counter() - t
        # The two rows the target compares, timed in alternation (a run of 100 tasks takes a
        # fraction of a millisecond, and this VM's speed drifts between such runs), and over
        # more runs than the copying rows.
        rt, sh = alternated(
            lambda: [p.submit(work.add, 1, 1).result() for _ in range(n_tasks)],
            lambda: [p.submit(work.first, shared).result() for _ in range(n_tasks)],
            5 * reps,
        )
        rows["trivial round trip (reference)"] = {"pymizu": rt / n_tasks}
        rows["80 MB read by 100 tasks, shared"] = {"pymizu": sh / n_tasks}
        k = 10  # copies are slow: fewer of them
        rows["80 MB read by 100 tasks, passed each time"] = {
            "pymizu": timed(lambda: [p.submit(work.first, big).result() for _ in range(k)], reps) / k
        }
        rows["map of 200 with an 80 MB extra argument"] = {
            "pymizu": timed(lambda: p.map(work.first, itertools.repeat(big, n_map), range(n_map)), reps) / n_map
        }
    with pymizu.PoolExecutor(w) as ex:
        rows["80 MB read by 100 tasks, shared"]["pymizu.PoolExecutor"] = (
            timed(lambda: [ex.submit(work.first, shared).result() for _ in range(n_tasks)], reps) / n_tasks
        )
    del shared

    import joblib

    with joblib.parallel_config(backend="loky", n_jobs=w):
        par = joblib.Parallel()
        # joblib memory-maps an array over 1 MB for its workers by itself (dumped once per call).
        rows["80 MB read by 100 tasks, shared"]["joblib (loky)"] = peer_timed(
            "joblib", lambda: par(joblib.delayed(work.first)(big) for _ in range(n_tasks)), reps, n_tasks
        )
        rows["map of 200 with an 80 MB extra argument"]["joblib (loky)"] = peer_timed(
            "joblib", lambda: par(joblib.delayed(work.first)(big, i) for i in range(n_map)), reps, n_map
        )
    with ProcessPoolExecutor(w) as ppe:
        k = 5
        rows["80 MB read by 100 tasks, passed each time"]["ProcessPoolExecutor"] = timed(lambda: [ppe.submit(work.first, big).result() for _ in range(k)], reps) / k

    peers = ["pymizu", "pymizu.PoolExecutor", "joblib (loky)", "ProcessPoolExecutor"]
    print(f"\nSharing one 80 MB input: per task (ms), {w} workers each, median of {reps} runs ({5 * reps} runs in alternation for the round trip and shared rows); share() itself took {share_once * 1e3:.1f} ms once")
    print("| measure | " + " | ".join(peers) + " | joblib / pymizu |")
    print("|---|" + "---:|" * (len(peers) + 1))
    for name, vals in rows.items():
        cells = " | ".join(f"{vals[p] * 1e3:.3f}" if p in vals else "" for p in peers)
        ratio = f"{vals['joblib (loky)'] / vals['pymizu']:.0f}x" if "joblib (loky)" in vals and "pymizu" in vals else ""
        print(f"| {name} | {cells} | {ratio} |")
    rt = rows["trivial round trip (reference)"]["pymizu"]
    sh = rows["80 MB read by 100 tasks, shared"]["pymizu"]
    print(f"shared per task / trivial round trip: {sh / rt:.2f}x (target: within 2x)")


if __name__ == "__main__":
    main()
