"""Task functions of the benchmarks (importable by every peer's workers)."""

import time


def warm(seconds):
    """A worker's first call in a benchmark: what the rows use imported, and held long enough
    that a pool which starts workers on demand starts all of them."""
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    time.sleep(seconds)


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


def spin_stamp(us):
    """Busy for `us` microseconds, then returns the moment it finished (`time.perf_counter()`
    reads CLOCK_MONOTONIC, the same clock in every process of the machine)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass
    return time.perf_counter()


def nrows(df):
    return len(df)


def arrow_relay(src, dst):
    """Reads an Arrow IPC file (memory-mapped) and writes it to another: the worker's half of a
    Python -> Python trip through files."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(src) as f:
        t = ipc.open_file(f).read_all()
    with ipc.new_file(dst, t.schema) as w:
        w.write_table(t)
    return t.num_rows


def first(a, i=0):
    """Reads one element of a big input: the cost is the input's trip, not the work."""
    return float(a[i])



def burn(x, rounds):
    """A fixed amount of computation, `rounds` rounds of integer arithmetic: unlike `spin`, it
    takes longer when something else takes its CPU, as real work does."""
    s = 0
    for i in range(rounds):
        s += i * i
    return x


def burn_skewed(x, rounds):
    """`burn`, but every hundredth element costs a hundred times as much."""
    return burn(x, rounds * 100 if x % 100 == 0 else rounds)


def burn_pair(a):
    """`burn(*a)`: for maps that pass one argument (imap_unordered)."""
    return burn(*a)


def burn_skewed_pair(a):
    """`burn_skewed(*a)`."""
    return burn_skewed(*a)


def rounds_for(us):
    """The `burn` rounds that take about `us` microseconds on this machine, now."""
    n = 200_000
    best = min(_time(lambda: burn(0, n)) for _ in range(5))
    return max(1, round(us * 1e-6 / (best / n)))


def _time(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t

def spin_span(x, us=5.0):
    """Busy for `us` microseconds: `(pid, start, end)` on the machine's monotonic clock, for
    timelines of where a map's time goes."""
    import os

    t = time.perf_counter()
    end = t + us * 1e-6
    while time.perf_counter() < end:
        pass
    return (os.getpid(), t, time.perf_counter())


def burn_span(x, rounds):
    """`burn(x, rounds)` that returns `(pid, start, end)` on the machine's monotonic clock, for
    timelines of where a map's time goes."""
    import os

    t = time.perf_counter()
    burn(x, rounds)
    return (os.getpid(), t, time.perf_counter())
