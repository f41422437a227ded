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
