"""Large values where `/dev/shm` is small: a 200 MB array there and back, and read by 100
tasks when shared once, with pymizu beside `ProcessPoolExecutor` and joblib (loky) in one
run, 2 workers each. Run as it is, it shows what the values cost in shared memory; run with a
64 MiB `/dev/shm` (`cargo xtask bench` runs it a second time in a private mount namespace with
a 64 MiB tmpfs over `/dev/shm`, as root), pymizu's values spill to files in the temporary
directory, and the rows show what spilling costs.

    python mizu-py/benchmarks/spill.py [--quick]
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np

import pymizu


def median_secs(f, reps: int) -> float:
    f()  # warm-up
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    reps = 2 if ap.parse_args().quick else 5
    st = os.statvfs("/dev/shm")
    shm_mib = st.f_blocks * st.f_frsize / (1 << 20)
    a = np.random.rand(25_000_000)  # 200 MB
    rows = []
    warnings.simplefilter("ignore", RuntimeWarning)  # the spill notice: said below instead

    with pymizu.Pool(2) as p:
        rt_mizu = median_secs(lambda: p.submit(np.copy, a).result(), reps)
        s = pymizu.share(a)
        reads_mizu = median_secs(
            lambda: [t.result() for t in [p.submit(operator.getitem, s, i) for i in range(100)]], reps) / 100
    spilled = any(n.startswith("mizu_") and n.endswith("s") for n in os.listdir(os.environ.get("TMPDIR", "/tmp")))
    del s
    with ProcessPoolExecutor(2) as ex:
        rt_ppe = median_secs(lambda: ex.submit(np.copy, a).result(), reps)
    from joblib import Parallel, delayed

    with Parallel(n_jobs=2) as par:
        rt_joblib = median_secs(lambda: par(delayed(np.copy)(a) for _ in range(1)), reps)
        reads_joblib = median_secs(lambda: par(delayed(operator.getitem)(a, i) for i in range(100)), reps) / 100
    rows.append(("200 MB array, there and back", "ms", rt_mizu * 1e3, rt_ppe * 1e3, rt_joblib * 1e3))
    rows.append(("200 MB array read by 100 tasks, per task", "µs", reads_mizu * 1e6, None, reads_joblib * 1e6))

    print(f"\nlarge values with /dev/shm of {shm_mib:.0f} MiB (pymizu's {'spilled to files' if spilled else 'in /dev/shm'}),"
          f" 2 workers, median of {reps}")
    print("| measure | unit | pymizu | ProcessPoolExecutor | joblib (loky) | vs PPE | vs joblib |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, unit, m, ppe, jl in rows:
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        ratio = lambda v: "-" if v is None else f"{v / m:.1f}x"
        print(f"| {name} | {unit} | {fmt(m)} | {fmt(ppe)} | {fmt(jl)} | {ratio(ppe)} | {ratio(jl)} |")
    print("(the same array is sent each time: pymizu compares it with the copy it made on the first "
          "send and passes that by reference; the shared row: pymizu shares the array once, joblib "
          "memory-maps it by itself, ProcessPoolExecutor would pickle it for every task)")


if __name__ == "__main__":
    main()
