"""The benchmarks' one way of timing: a warm-up call, then the median of `reps` calls."""

import statistics
import time


def timed(f, reps, per=1):
    """Median seconds of `f()` over `reps` calls after a warm-up, divided by `per` (the
    operations one call runs)."""
    f()
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        runs.append((time.perf_counter() - t) / per)
    return statistics.median(runs)
