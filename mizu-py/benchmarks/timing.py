"""The benchmarks' one way of timing: a warm-up call, then the median of `reps` calls; and
the command line the pool benchmarks share."""

import argparse
import statistics
import time


def pool_args():
    """`--quick` (fewer repetitions: the demo) and `--workers N` (default 2), parsed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (the demo)")
    ap.add_argument("--workers", type=int, default=2)
    return ap.parse_args()


def timed(f, reps, per=1, most=None):
    """Median seconds of `f()` over `reps` calls after a warm-up, divided by `per` (the
    operations one call runs). With `most`, as many more calls, up to `most`, as fit in about
    a second by the warm-up's time: a short run's median then moves less with the VM."""
    t = time.perf_counter()
    f()
    if most is not None:
        reps = max(reps, min(most, int(1.0 / max(time.perf_counter() - t, 1e-6))))
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        runs.append((time.perf_counter() - t) / per)
    return statistics.median(runs)


def peer_timed(what, f, reps, per=1):
    """`timed(f, reps, per)` of a peer, tried up to three times: joblib's loky workers now and
    then fail to read the memory-mapped file joblib made for them (`BrokenProcessPool: A task
    has failed to un-serialize`, the file gone from /dev/shm: joblib's own race, seen without
    pymizu too). NaN (printed as such) when every try fails, so that the run goes on."""
    for attempt in range(3):
        try:
            return timed(f, reps, per)
        except Exception as e:  # a peer's failure must not end the benchmark
            print(f"note: {what} failed (try {attempt + 1} of 3): {type(e).__name__}: {str(e).splitlines()[0]}")
    return float("nan")
