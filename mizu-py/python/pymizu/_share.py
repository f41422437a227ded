"""`share(obj)`: big inputs copied into shared memory once, then sent by reference."""

from __future__ import annotations

import pickle
import sys
# (Annotations only: typing costs a worker's start-up ~9 ms.)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from . import _native

# Arrays at least this large that several elements of one map pass are shared once for the
# map (smaller ones cost less to copy than to share).
MAP_SHARE_MIN = 1 << 20
_exit_registered = False


def share(obj: Any) -> Any:
    """A read-only copy of `obj` whose data lives in shared memory: sending it — as a task's
    argument or result, in a map, through a channel, to workers of either language — passes a
    reference, whatever its size; workers see views of the same memory. Works for numpy
    arrays, pandas frames and series, pyarrow arrays and tables, polars frames and series (and
    anything whose pickle carries its data as out-of-band buffers). The memory is freed when
    the last holder, in any process, lets go of it.

    Numbers, booleans and dates are shared; Python objects inside (an object-dtype column)
    are copied with the rest of the pickle. The copy is read-only: modifying it raises (numpy:
    "assignment destination is read-only"); make a private copy (`.copy()`) to modify.
    """
    _at_exit()
    mod = type(obj).__module__.partition(".")[0]
    if mod == "polars":
        import polars

        return polars.from_arrow(share(obj.to_arrow()), rechunk=False)
    np = sys.modules.get("numpy")
    if np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject:
        return _share_array(np, obj)
    bufs: list = []
    data = pickle.dumps(obj, 5, buffer_callback=bufs.append)
    shared = [_native.share_buffer(b.raw()) for b in bufs]
    return pickle.loads(data, buffers=shared)


def empty(shape, dtype=float, order: str = "C"):
    """A writable numpy array whose memory is shared (its contents undefined, as
    `numpy.empty`'s): sending it to tasks — as an argument, in a map, bound by
    `functools.partial`, through a channel — passes a reference, and the tasks' views are
    writable too, so they can fill in results without a copy. What one process writes, others
    see; a task's writes are visible to the caller once it has the task's result (completion
    orders them). Tasks writing disjoint parts (rows, slices, elements) never interfere;
    concurrent writes to the same bytes leave one of the values or a mix of them (no other
    harm). The memory is freed when the last holder, in any process, lets go of it. R workers
    get a read-only copy."""
    return _empty(shape, dtype, order, False)


def zeros(shape, dtype=float, order: str = "C"):
    """`empty`, filled with zeros (as `numpy.zeros`)."""
    return _empty(shape, dtype, order, True)


def _empty(shape, dtype, order, zero):
    import numpy as np

    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError("pymizu.empty/zeros: an object dtype cannot live in shared memory")
    import operator

    try:
        shape = (operator.index(shape),)
    except TypeError:
        shape = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimensions are not allowed, got {shape!r}")
    n = dt.itemsize
    for d in shape:
        n *= d
    _at_exit()
    buf = _native.shared_empty(n, zero)
    return np.frombuffer(buf, dtype=dt, count=n // dt.itemsize if dt.itemsize else 0).reshape(shape, order=order)


def _at_exit():
    """The names of shared segments go at interpreter exit (registered once)."""
    global _exit_registered
    if not _exit_registered:
        import atexit

        atexit.register(_native.release_shared)
        _exit_registered = True


def _share_array(np, a):
    """An array's bytes in memory order (any plain dtype, dates and times included, which
    export no buffer), shared, and the same array over them. Where the cross-language mapping
    keeps the array as it is, it is shared as the value R receives, so R workers view it too."""
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        a = np.ascontiguousarray(a)
    s = _native.share_ndarray(a)
    if s is not None:
        return s
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    shm = _native.share_buffer(a.ravel(order="K").view(np.uint8))
    return np.frombuffer(shm, dtype=a.dtype).reshape(a.shape, order=order)


def is_shared(obj: Any) -> bool:
    """Whether `obj`'s data (a numpy array, or anything exporting a buffer) lives in shared
    memory this process holds — a `share()` result, or data received from another process —
    so that sending it passes a reference."""
    try:
        return _native.shared_region(obj) is not None
    except (TypeError, ValueError, BufferError):
        return False


def share_repeated(items: list, star: bool) -> list:
    """A map's elements (argument tuples when `star`, else single arguments) with every large
    array or frame that the first element and others pass (`itertools.repeat(big)`, the same
    object in each tuple) replaced by one shared copy, so that it is copied once for the map
    instead of once per element or chunk."""
    if len(items) < 2:
        return items
    # An argument every element passes is in the first one: looking there first keeps the
    # common map (of numbers, of distinct arrays) free of a scan.
    first = items[0]
    if not any(_worth_sharing(a) for a in (first if star else (first,))):
        return items
    seen: dict[int, int] = {}
    for x in items:
        for a in x if star else (x,):
            if _worth_sharing(a):
                seen[id(a)] = seen.get(id(a), 0) + 1
    repeated = {k for k, n in seen.items() if n > 1}
    if not repeated:
        return items
    shared: dict[int, Any] = {}
    if not star:
        return [_shared_once(x, shared) if id(x) in repeated else x for x in items]
    return [
        tuple(_shared_once(a, shared) if id(a) in repeated else a for a in x)
        if any(id(a) in repeated for a in x)
        else x
        for x in items
    ]


def share_fn(fn):
    """`fn` with the large arrays and frames a `functools.partial` binds shared (sent once
    per map instead of with every chunk)."""
    import functools

    if type(fn) is not functools.partial:
        return fn
    args = tuple(share(a) if _worth_sharing(a) else a for a in fn.args)
    kw = {k: share(v) if _worth_sharing(v) else v for k, v in fn.keywords.items()}
    if all(a is b for a, b in zip(args, fn.args)) and all(kw[k] is fn.keywords[k] for k in kw):
        return fn
    return functools.partial(fn.func, *args, **kw)


def _shared_once(a, cache: dict):
    s = cache.get(id(a))
    if s is None:
        s = cache[id(a)] = share(a)
    return s


def _worth_sharing(a) -> bool:
    np = sys.modules.get("numpy")
    if np is not None and type(a) is np.ndarray:
        return a.nbytes >= MAP_SHARE_MIN and a.dtype.hasobject is False and not is_shared(a)
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(a, (pd.DataFrame, pd.Series)):
        size = a.memory_usage(deep=False)
        if (size.sum() if isinstance(a, pd.DataFrame) else size) < MAP_SHARE_MIN:
            return False
        for col in a.columns if isinstance(a, pd.DataFrame) else [None]:
            v = (a if col is None else a[col]).values
            if np is not None and type(v) is np.ndarray and v.dtype.kind in "biufcmM":
                return not is_shared(v)  # a frame shared already has its numbers shared
        return True
    return False
