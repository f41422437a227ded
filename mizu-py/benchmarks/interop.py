"""Python and R serving each other, against how people combine them without a shared format.

`python mizu-py/benchmarks/interop.py [--quick]` (run by `cargo xtask bench` and, with
--quick, by `cargo xtask demo`; needs the mizu R package where R finds it, e.g.
`R_LIBS=target/rlib`, and data.table for the CSV peer). Rows:

1. a trivial call's round trip: Python → R worker and R → Python worker, beside each
   language's own round trip (Python → Python worker, R → R worker), same run;
2. a data frame of 1 M rows and 10 columns (doubles, integers, strings, categories, dates)
   sent Python → R worker → back to Python, against the usual ways without a shared format:
   `to_csv`, an R worker that reads it with `data.table::fread` and writes it back with
   `fwrite`, `read_csv`; and Arrow IPC files in /dev/shm written and read by pyarrow at both
   ends of a Python → Python worker trip (each path starts from the pandas frame and ends with
   a table pyarrow reads);
3. the same at 1 000 rows;
4. a map of `sqrt` over 10 000 numbers on two workers, per element: Python → R workers and
   R → Python workers beside each language's own map;
5. an R caller's trivial round trip without R's own closure calls (`mizu-r/benchmarks/split.R`,
   which times the two in turns) beside Python's round trip (two workers each; the mean of a
   measure before and one after R's), five pairs: the native path, the worker and the waiting
   of each language, compared on the same machine state.

Every time is the median of several runs; ratios are peer time / mizu time.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.ipc as ipc  # noqa: E402

import pymizu  # noqa: E402
import work  # noqa: E402
from timing import timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))




def frame(n: int) -> pd.DataFrame:
    g = np.random.default_rng(7)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta"])
    return pd.DataFrame(
        {
            "x1": g.random(n),
            "x2": g.random(n),
            "x3": g.normal(size=n),
            "i1": g.integers(0, 1_000_000, n, dtype=np.int32),
            "i2": g.integers(-50, 50, n, dtype=np.int32),
            "s1": words[g.integers(0, 6, n)].astype(object),
            "s2": pd.Series(g.integers(0, 10**6, n)).map("id{}".format),
            "f1": pd.Categorical(words[g.integers(0, 6, n)]),
            "f2": pd.Categorical(g.integers(0, 3, n).astype(str)),
            "d": np.datetime64("2020-01-01") + g.integers(0, 3650, n).astype("timedelta64[D]"),
        }
    )


def r_side(quick: bool) -> dict:
    """R → R and R → Python round trips, measured by R itself."""
    r = subprocess.run(
        ["Rscript", os.path.join(ROOT, "mizu-r/benchmarks/interop.R")] + (["--quick"] if quick else []),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MIZU_PYTHON": sys.executable},
    )
    if r.returncode != 0:
        raise SystemExit(f"interop.R failed:\n{r.stdout}\n{r.stderr}")
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("interop "):
            _, k, v = line.split()
            out[k] = float(v)
    return out


def split_pairs(quick: bool) -> list:
    """(Python round trip, R round trip, R's closures, R without them) in seconds, measured in
    turns: Python's is the mean of one measure before and one after R's."""
    import operator

    n = 5_000 if quick else 20_000
    with pymizu.Pool(2) as p:
        submit = p.submit

        def py_rt():
            for i in range(n):
                submit(operator.pos, i).result()

        pairs = []
        for _ in range(3 if quick else 5):
            before = timed(py_rt, 7) / n
            r = subprocess.run(
                ["Rscript", os.path.join(ROOT, "mizu-r/benchmarks/split.R")] + (["--quick"] if quick else []),
                capture_output=True,
                text=True,
                timeout=600,
            )
            if r.returncode != 0:
                raise SystemExit(f"split.R failed:\n{r.stdout}\n{r.stderr}")
            got = dict(line.split()[1:] for line in r.stdout.splitlines() if line.startswith("split "))
            after = timed(py_rt, 7) / n
            pairs.append(((before + after) / 2, float(got["rt"]), float(got["shell"]), float(got["outside"])))
    return pairs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    q = 0.25 if a.quick else 1.0
    k = max(200, int(4000 * q))
    reps = 5 if a.quick else 9

    # 1. Trivial round trips (one worker each: the caller and the worker each get a CPU).
    with pymizu.Pool(1) as p:
        submit = p.submit

        def pp():
            for _ in range(k):
                submit(work.add, 1, 1).result()

        py_py = timed(pp, reps) / k
    with pymizu.Pool(1, language="r") as p:
        c = pymizu.call("sum", 1, 1)
        submit = p.submit

        def pr():
            for _ in range(k):
                submit(c).result()

        py_r = timed(pr, reps) / k
    # 4 (measured here, printed last). Maps of a tiny function (two workers).
    xs = [float(i) for i in range(1, 10_001)]
    with pymizu.Pool(2) as p:
        map_py_py = timed(lambda: p.map(math.sqrt, xs), reps) / len(xs)
    with pymizu.Pool(2, language="r") as p:
        c = pymizu.call("sqrt")
        map_py_r = timed(lambda: p.map(c, xs), reps) / len(xs)
    rs = r_side(a.quick)
    r_r, r_py = rs["r_r"], rs["r_py"]
    slower = max(py_py, r_r)
    print("\nR and Python serving each other: trivial call round trip (1 worker, median of runs)")
    print("| caller -> worker | round trip | vs the slower same-language one |")
    print("|---|---:|---:|")
    for name, v in [("Python -> Python", py_py), ("R -> R", r_r), ("Python -> R", py_r), ("R -> Python", r_py)]:
        print(f"| {name} | {v * 1e6:.2f} us | {v / slower:.2f}x |")

    # 2, 3. Frame relays.
    have_dt = subprocess.run(
        ["Rscript", "-e", "quit(status = !requireNamespace('data.table', quietly = TRUE))"],
        capture_output=True,
    ).returncode == 0
    tmp = tempfile.mkdtemp(prefix="mizu-interop-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    rows_list = [1_000, 250_000 if a.quick else 1_000_000]
    results = {}
    try:
        with pymizu.Pool(1, language="r") as rp, pymizu.Pool(1) as pp_:
            for n in rows_list:
                df = frame(n)
                ident = pymizu.call("identity")

                def mizu_relay():
                    t = rp.submit(ident, df).result()
                    return pa.table(t)

                back = mizu_relay()
                assert back.num_rows == n and back.column_names == list(df.columns)
                assert back.column("x1").to_numpy().tolist()[:5] == df["x1"].tolist()[:5]
                rreps = reps if n <= 10_000 else 3
                m = timed(mizu_relay, rreps)

                src, dst = os.path.join(tmp, "in.csv"), os.path.join(tmp, "out.csv")
                csv_call = pymizu.call(
                    source="data.table::fwrite(data.table::fread(src), dst); 0", src=src, dst=dst
                )

                def csv_relay():
                    df.to_csv(src, index=False)
                    rp.submit(csv_call).result()
                    return pd.read_csv(dst)

                csv = timed(csv_relay, rreps) if have_dt else float("nan")

                a_in, a_out = os.path.join(tmp, "in.arrow"), os.path.join(tmp, "out.arrow")

                def ipc_relay():
                    t = pa.Table.from_pandas(df, preserve_index=False)
                    with ipc.new_file(a_in, t.schema) as w:
                        w.write_table(t)
                    pp_.submit(work.arrow_relay, a_in, a_out).result()
                    with pa.memory_map(a_out) as f:
                        return ipc.open_file(f).read_all()

                arrow = timed(ipc_relay, rreps)
                # A frame that is already in shared memory (received earlier) relayed again:
                # references both ways.
                shared = rp.submit(ident, df).result()

                def shared_relay():
                    return pa.table(rp.submit(ident, shared).result())

                sh = timed(shared_relay, max(reps, 25))  # (sub-millisecond: more runs, a steadier median)
                results[n] = (m, csv, arrow, sh)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nA data frame of 10 columns sent Python -> R worker -> Python (median of runs)")
    print("| rows | mizu (pandas frame) | mizu (frame already in shared memory) | CSV + data.table (fread/fwrite) | Arrow IPC files in /dev/shm (Python -> Python) | vs CSV | vs Arrow IPC |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, (m, csv, arrow, sh) in results.items():
        print(f"| {n:,} | {m * 1e3:.2f} ms | {sh * 1e3:.2f} ms | {csv * 1e3:.1f} ms | {arrow * 1e3:.2f} ms | {csv / m:.0f}x | {arrow / m:.1f}x |")
    big, small = rows_list[-1], rows_list[0]
    print(f"mizu's {big:,}-row relay costs {results[big][0] / results[small][0]:.1f}x its {small:,}-row relay; "
          f"of a frame already in shared memory (sent on by reference) {results[big][3] / results[small][3]:.1f}x")
    if not have_dt:
        print("note: data.table is not installed, so the CSV peer did not run (Debian: r-cran-data.table)")

    slower = max(map_py_py, rs["map_r_r"])
    print(f"\nA map of sqrt over {len(xs):,} numbers (2 workers, per element, median of runs)")
    print("| caller -> workers | per element | vs the slower same-language one |")
    print("|---|---:|---:|")
    for name, v in [
        ("Python -> Python", map_py_py),
        ("R -> R", rs["map_r_r"]),
        ("Python -> R", map_py_r),
        ("R -> Python", rs["map_r_py"]),
    ]:
        print(f"| {name} | {v * 1e6:.3f} us | {v / slower:.2f}x |")

    pairs = split_pairs(a.quick)
    print("\nAn R caller's trivial round trip without R's own closures, beside Python's (2 workers, in turns)")
    print("| pair | Python round trip | R round trip | R's closures | R without them | ratio to Python |")
    print("|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for i, (py, rt, shell, outside) in enumerate(pairs, 1):
        ratios.append(outside / py)
        print(f"| {i} | {py * 1e6:.2f} us | {rt * 1e6:.2f} us | {shell * 1e6:.2f} us | "
              f"{outside * 1e6:.2f} us | {ratios[-1]:.2f}x |")
    ratios.sort()
    print(f"median ratio {ratios[len(ratios) // 2]:.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f}x)")


if __name__ == "__main__":
    main()
