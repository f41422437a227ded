"""Functions the tests run in worker processes (importable there via PYTHONPATH)."""

import functools
import itertools
import os
import time


def add(a, b):
    return a + b


def boom(msg):
    raise ValueError(msg)


class Unpicklable(Exception):
    def __init__(self):
        super().__init__("cannot travel")
        self.lock = __import__("threading").Lock()


def raise_unpicklable():
    raise Unpicklable()


def die():
    os._exit(3)


def pid():
    return os.getpid()


def sleep(s):
    time.sleep(s)
    return s


def spin(s):
    """Keeps a CPU busy for `s` seconds."""
    end = time.perf_counter() + s
    while time.perf_counter() < end:
        pass
    return s


def hold(x, s):
    """Holds `x` (a view of the caller's memory) for `s` seconds."""
    time.sleep(s)
    return len(x)


def big(n):
    return b"x" * n


def ident(x):
    return x


def describe(x):
    """What a worker received: type name and, for arrays, whether it is a read-only view."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, bool(x.flags.writeable), float(x.sum()) if x.dtype.kind in "fiub" else None)
    return (type(x).__name__,)


def rng_draws(i, n=3):
    import random

    import pymizu

    return (pymizu.current_rng().random(n).tolist(), random.random())


def fails_at(i, bad):
    if i == bad:
        raise KeyError(i)
    return i


def nested_sum(n):
    import pymizu

    return sum(pymizu.current_pool().map(add, range(n), range(n)))


def nested_first(n):
    """Submits `n` nested tasks and returns the value of the first to finish."""
    import pymizu

    pool = pymizu.current_pool()
    return pool.collect_any([pool.submit(add, i, 1) for i in range(n)], timeout=60).result()


def nested_all_in_flight(n):
    """Submits `n` nested tasks before collecting any of them."""
    import pymizu

    pool = pymizu.current_pool()
    ts = [pool.submit(add, i, 1) for i in range(n)]
    return sum(t.result() for t in ts)


def nested_search(rounds):
    """Each round submits 100 nested tasks, takes the first to finish and cancels the rest (as
    a search does); then submits 40 more and sums them."""
    import pymizu

    pool = pymizu.current_pool()
    cancelled = 0
    for _ in range(rounds):
        ts = [pool.submit(add, i, 1) for i in range(100)]
        pool.collect_any(ts, timeout=60)
        cancelled += sum(t.cancel() for t in ts)
    return cancelled, sum(pool.submit(add, i, 1).result(timeout=60) for i in range(40))


def nested_deep(depth):
    import pymizu

    if depth == 0:
        return 1
    pool = pymizu.current_pool()
    return sum(pool.map(nested_deep, [depth - 1] * 2))


def nested_seeded(n):
    import pymizu

    return pymizu.current_pool().map(rng_draws, range(n), seed=7)


STATE = {}


def remember(k, v):
    STATE[k] = v


def recall(k):
    return STATE.get(k)


def init_fail():
    raise RuntimeError("initializer refuses")


def add_pid(x):
    return (x, os.getpid())


def segv():
    import ctypes

    ctypes.string_at(0)


def make_lock():
    """A result pickle refuses."""
    return __import__("threading").Lock()


TICKS = [0]


def start_ticker():
    """Starts a thread in this worker that counts while it gets the interpreter lock."""
    import threading

    def tick():
        while True:
            TICKS[0] += 1
            time.sleep(0.001)

    threading.Thread(target=tick, daemon=True).start()
    return os.getpid()


def ticks():
    return (TICKS[0], os.getpid())


def kw_pair(a, *, b):
    return a, b


def drop_in_a_cycle(x):
    """Keeps `x` (a view of the caller's memory) in a reference cycle that becomes garbage
    at once: only a full collection frees it."""
    import gc

    gc.disable()  # (re-enabled by `ones_after`) so that no automatic collection frees it
    cycle = [x]
    cycle.append(cycle)
    return len(x)


def ones_after(n):
    """`n` float64 ones; the collector is on again afterwards."""
    import gc
    import numpy as np

    try:
        return np.ones(n)
    finally:
        gc.enable()


def fail_with(msg):
    raise ValueError(msg)


def spin_then_fail(s, msg):
    spin(s)
    raise ValueError(msg)


_global = None


def set_global(v):
    global _global
    _global = v


def get_global():
    return _global


def divide(a, b):
    return a / b


def put(q, x):
    q.put(x)


def locked_increment(lock, value):
    with lock:
        value.value += 1
        return value.value


def store(d, k, v):
    d[k] = v


def announce(q):
    q.put(os.getpid())


def fail_initializer(q):
    import logging
    from logging.handlers import QueueHandler

    logger = logging.getLogger("concurrent.futures")
    logger.addHandler(QueueHandler(q))
    logger.propagate = False
    raise ValueError("initializer failed on purpose")


class Thing:
    pass


def make_object(_):
    return Thing()


def sleep_and_print(s, msg):
    time.sleep(s)
    print(msg, flush=True)


def die_after(s):
    time.sleep(s)
    os._exit(3)


def where(a):
    """Where a received array's memory lives (segment, region offset, offset in it), and its sum."""
    return pymizu_region(a), float(a.sum())


def pymizu_region(a):
    from pymizu import _native

    return _native.shared_region(a)


def where_indexed(i, a):
    return i, pymizu_region(a)


def frame_where(df):
    return [pymizu_region(df[c].to_numpy()) for c in df.columns], float(df.to_numpy().sum())


def hold_and_echo(a):
    return a


_kept = {}


def keep_where(k, a):
    """Keeps a view of `a` (so its memory stays in use) and says where it lives."""
    _kept[k] = a
    return pymizu_region(a)


def forget_all():
    _kept.clear()


def fill_row(out, i, v):
    """Writes `v` into row `i` of `out` (an array the caller made with pymizu.zeros)."""
    out[i] = v
    return i


def wait_for(path):
    """Waits until `path` exists (a gate the test opens; the bound is only a hang guard)."""
    end = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.001)
    return os.path.exists(path)


def mark(folder, i):
    """Leaves a trace that call `i` ran."""
    open(os.path.join(folder, str(i)), "w").close()
    return i


def mark_past_gate(folder, gate, i):
    """Call `i` of a map: the first returns at once, the others wait for `gate` (see
    `wait_for`) and leave a trace that they ran."""
    if i and not wait_for(gate):
        raise TimeoutError(gate)
    return mark(folder, i)


def fail_odd(i):
    if i % 2:
        raise ValueError(f"odd {i}")
    return i


def stop_at(i, bad):
    """Raises StopIteration at `bad` (a loop over calls could take it for their end) and
    SystemExit right after it."""
    if i == bad:
        raise StopIteration(i)
    if i == bad + 1:
        raise SystemExit(i)
    return i


def die_at(i, bad):
    if i == bad:
        os._exit(3)
    return i


def lock_at(i, bad):
    """A result pickle refuses at `bad`."""
    return make_lock() if i == bad else i


def fresh_list(i):
    return [i]


class TwoArgumentError(Exception):
    """Pickles, but unpickling calls `__init__` with one argument: it cannot be rebuilt."""

    def __init__(self, a, b):
        super().__init__(a)
        self.b = b


def raise_two_argument_error():
    raise TwoArgumentError("a", "b")


def wait_event(event):
    """Returns once `event` (a multiprocessing Event) is set; False after a minute."""
    return event.wait(60)


def wait_for_file(pair):
    """Waits until the file `pair[0]` exists (at once for None; a 60 s hang guard), then
    returns `pair[1]`."""
    path, value = pair
    deadline = time.monotonic() + 60
    while path is not None and not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"hang guard: {path} never appeared")
        time.sleep(0.005)
    return value


def triple(a, b, c):
    """The three arguments, as a tuple (a map of three iterables)."""
    if a == "bad":
        raise ValueError(b)
    return (a, b, c)


def signature(*args, **kwargs):
    """What a call gave: its positional arguments and its keywords, sorted."""
    return args, sorted(kwargs.items())


class Partial(functools.partial):
    """A partial of its own type: called as it defines, not unwrapped."""

    def __call__(self, /, *args, **kwargs):
        return ("own", super().__call__(*args, **kwargs))


_ran = itertools.count()


def ran_before(*_):
    """How many tasks this function ran in this worker before this one: the order they ran."""
    return next(_ran)
