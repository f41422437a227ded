"""Task functions of the benchmarks (importable by every peer's workers)."""

import time


def add(a, b):
    return a + b


def ident(x):
    return x


def spin(x, us=5.0):
    """Busy for about `us` microseconds (a small real task)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass
    return x


def nrows(df):
    return len(df)
