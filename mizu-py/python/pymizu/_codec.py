"""Pickling for payloads: protocol 5 with out-of-band buffers (numpy, pandas, pyarrow, and
anything else exporting `PickleBuffer`s), which the native layer lays out in shared memory and
the receiver reads in place. polars frames and series travel as Arrow (zero-copy both ways);
what plain pickle refuses (lambdas, local functions) is retried with cloudpickle, and what
`__main__` defines where a worker cannot import it (`_main`) travels by value with it.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import types
import weakref

from . import _by_value, _main

# (Annotations only: typing costs a worker's start-up ~9 ms.)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_dumps = pickle.dumps
loads = pickle.loads


_FN_TYPES = (types.FunctionType, types.BuiltinFunctionType, type)
_fn_bytes: dict = {}  # caller: function -> its pickle (by reference)
_fn_objs: dict = {}  # worker: pickle -> function
# caller: functions pickle cannot name (their module cannot be imported), which travel by value
_unnamed: weakref.WeakSet = weakref.WeakSet()
_SCALARS = frozenset((int, float, str, bool, type(None), bytes))
_NO_BUFFERS: tuple = ()


def fn_ref(fn) -> bytes | None:
    """The pickle (cached) of a function or class to send ahead of a call's arguments: by
    reference for a module-level one; by value for a lambda, a local function or what `_main`
    says travels by value, while `_by_value` can keep it. None for anything else (callables
    with state, functions holding mutable data), which is pickled with each call."""
    if type(fn) not in _FN_TYPES:
        return None
    try:
        b = _fn_bytes.get(fn)
    except TypeError:  # unhashable
        return None
    if b is not None:
        return b
    if type(fn) is types.FunctionType:
        b = _by_value.kept(fn)
        if b is not None:
            return b
        if _sent_by_value(fn):
            return _by_value.head(fn)
    elif getattr(fn, "__module__", None) == "__main__" and _main.by_value(fn):
        return None
    if type(fn) is types.BuiltinFunctionType and not isinstance(fn.__self__, (types.ModuleType, type(None))):
        return None  # a bound method of a builtin object (`d.get`) pickles its object by value
    try:
        b = _dumps(fn, 5)
    except Exception:
        # A function whose module cannot be imported (made by `exec` in a namespace of its
        # own, or with no module at all): by value, and kept, as a lambda is. Pickling it by
        # name again at each call would search `sys.path` for that module each time.
        if type(fn) is types.FunctionType:
            _unnamed.add(fn)
            return _by_value.head(fn)
        return None
    if len(b) > 512:
        return None
    if len(_fn_bytes) > 4096:
        _fn_bytes.clear()
    _fn_bytes[fn] = b
    return b


def _sent_by_value(fn) -> bool:
    """`<lambda>`, `<locals>`, what `_main` says workers cannot take by name, and what pickle
    could not name."""
    return (
        "<" in fn.__qualname__
        or (fn.__module__ == "__main__" and _main.by_value(fn))
        or fn in _unnamed
    )


def call_ref(fn) -> bytes | tuple[bytes, tuple] | None:
    """For one call of `fn`: `fn_ref(fn)`, or, for a function that travels by value and is not
    kept (one made anew for each call), `(its template's pickle, state)` from
    `_by_value.rebound`: the call is then `template(state, *args, **kwargs)`."""
    if type(fn) is types.FunctionType and fn not in _fn_bytes:
        b = _by_value.kept(fn)
        if b is not None:
            return b
        if _sent_by_value(fn):
            r = _by_value.rebound(fn)
            if r is not None:
                return r
    return fn_ref(fn)


def dumps_args(args: tuple, kwargs: dict | None) -> tuple[bytes, list]:
    """The pickle of a call's arguments (the positional ones a tuple; with keywords, a list
    `[args, kwargs]`) and its out-of-band buffers."""
    if not kwargs:
        # Scalar arguments (the common small call) need no buffer machinery.
        for a in args:
            if type(a) not in _SCALARS:
                break
        else:
            return _dumps(args, 5), _NO_BUFFERS
        return dumps(args)
    return dumps([args, kwargs])


def dumps_call(fn, args: tuple, kwargs: dict) -> tuple[bytes, list, bytes | None]:
    """A call `fn(*args, **kwargs)` as `(pickle, buffers, head)`: with `head`, the function's
    pickle by reference (cached here, and by the worker as what it unpickles to), the pickle is
    the arguments' (`dumps_args`), so a trivial call costs one small pickle; without, the
    pickle is the whole call `(fn, args, kwargs)`."""
    head = fn_ref(fn)
    if head is None:
        if type(fn) is types.FunctionType and fn in _unnamed:
            # (Straight to the by-value pickle: pickling it by name fails, after a search.)
            data, bufs = _dumps_by_value((fn, args, kwargs))
            return data, bufs, None
        data, bufs = dumps((fn, args, kwargs))
        return data, bufs, None
    data, bufs = dumps_args(args, kwargs)
    return data, bufs, head


def fn_from_ref(fb: bytes):
    """The function `fn_ref` pickled as `fb` (unpickled once per process)."""
    fn = _fn_objs.get(fb)
    if fn is None:
        fn = loads(fb)
        if len(_fn_objs) > 4096:
            _fn_objs.clear()
        _fn_objs[fb] = fn
    return fn


def loads_call(data, bufs, head: bytes | None = None):
    """`(fn, args, kwargs)` from `dumps_call`'s `(pickle, buffers, head)`."""
    if head is None:
        return loads(data, buffers=bufs)
    fn = fn_from_ref(head)
    rest = loads(data, buffers=bufs)
    if type(rest) is tuple:
        return fn, rest, {}
    return fn, rest[0], rest[1]


def dumps(obj) -> tuple[bytes, list]:
    """`(pickle, out-of-band buffers)` for `obj`."""
    np = sys.modules.get("numpy")
    if np is not None and _has_array(obj, np.ndarray):
        data, bufs = _dumps_arrays(obj)
    else:
        bufs = []
        try:
            data = _dumps(obj, 5, buffer_callback=bufs.append)
        except Exception as e:
            return _dumps_fallback(obj, e)
        # polars pickles frames as in-band IPC bytes; its module name in the pickle says so.
        if b"polars" in data and "polars" in sys.modules:
            data, bufs = _dumps_with_arrow(obj)
    # `__main__`'s functions, classes and instances that a worker cannot import by name
    # (`_main`) travel by value.
    if b"__main__" in data and _names_main(data, obj) and _main.pickle_by_value(data):
        return _dumps_kept(obj) or _dumps_by_value(obj)
    return data, bufs


def _names_main(data: bytes, obj, kept: dict | None = None) -> bool:
    """Whether `data`, the pickle of `obj`, says `__main__` anywhere but inside the byte strings
    among `obj`'s items (and the items of a tuple among them: a call's arguments) and the kept
    pickles `kept` (by id) it holds: bytes are data, never a reference to `__main__`. A map's
    chunk carries its function's kept pickle so (`fn_ref`), which says `__main__` when the
    function is one of its own; that alone must not send the chunk by value. (Counted, each
    byte string once as pickle memoizes it: a reference elsewhere says `__main__` at least once
    more.)"""
    inside = {k: b.count(b"__main__") for k, b in (kept or {}).items()}
    if type(obj) is tuple or type(obj) is list:
        for a in obj:
            for b in a if type(a) is tuple else (a,):
                if type(b) is bytes and b"__main__" in b:
                    inside[id(b)] = b.count(b"__main__")
    return not inside or data.count(b"__main__") > sum(inside.values())


def _dumps_by_value(obj) -> tuple[bytes, list]:
    try:
        import cloudpickle
    except ImportError:
        raise pickle.PicklingError(
            "functions and classes that workers cannot import from `__main__` (an interactive "
            "session, a script without a `__main__` guard, a function defined under the guard) "
            "travel by value with cloudpickle: pip install cloudpickle"
        ) from None
    bufs: list = []
    return cloudpickle.dumps(obj, 5, buffer_callback=bufs.append), bufs


def _has_array(obj, ndarray) -> bool:
    """Whether `obj` is an array, or a tuple or list holding one directly or in a nested
    argument tuple or keyword dict (a call's `args`, `[args, kwargs]` or `(fn, args, kwargs)`)."""
    t = type(obj)
    if t is ndarray:
        return True
    if t is tuple or t is list:
        for a in obj:
            ta = type(a)
            if ta is ndarray:
                return True
            if ta is tuple:
                for b in a:
                    if type(b) is ndarray:
                        return True
            elif ta is dict:
                for b in a.values():
                    if type(b) is ndarray:
                        return True
    return False


def _rebuild_ndarray(buf, dtype: str, shape: tuple, fortran: bool):
    import numpy

    a = numpy.frombuffer(buf, dtype)
    return a.reshape(shape, order="F" if fortran else "C")


def _reduce_ndarray(a):
    # numpy's own reduction pickles the dtype object and imports modules on every call; a
    # contiguous array of a plain dtype needs only its dtype string, shape and buffer.
    dt = a.dtype
    if dt.fields is None and not dt.hasobject and dt.kind != "V" and a.ndim:
        if a.flags.c_contiguous:
            return _rebuild_ndarray, (pickle.PickleBuffer(a), dt.str, a.shape, False)
        if a.flags.f_contiguous:
            return _rebuild_ndarray, (pickle.PickleBuffer(a), dt.str, a.shape, True)
    return a.__reduce_ex__(5)


class _ArrayPickler(pickle.Pickler):
    """A pickler with the fast array reduction (only used when arrays are present)."""

    dispatch_table = dict(copyreg.dispatch_table)


def _dumps_arrays(obj) -> tuple[bytes, list]:
    if _ArrayPickler.dispatch_table.get(sys.modules["numpy"].ndarray) is None:
        _ArrayPickler.dispatch_table[sys.modules["numpy"].ndarray] = _reduce_ndarray
    bufs: list = []
    f = io.BytesIO()
    try:
        _ArrayPickler(f, 5, buffer_callback=bufs.append).dump(obj)
    except Exception as e:
        return _dumps_fallback(obj, e)
    return f.getvalue(), bufs


class _KeptFunctions(_ArrayPickler):
    """Pickles each function that travels by value and has a kept pickle (`fn_ref`) as the
    call `fn_from_ref(kept pickle)`: a worker unpickles the function once, and the rest is
    plain pickle (with the fast array reduction). `kept` holds the kept pickles written, by
    id."""

    def __init__(self, file, buffer_callback):
        super().__init__(file, 5, buffer_callback=buffer_callback)
        self.kept: dict = {}

    def reducer_override(self, obj):
        t = type(obj)
        if t is types.FunctionType:
            if _sent_by_value(obj):
                b = fn_ref(obj)
                if b is None:
                    raise _NotKept
                self.kept[id(b)] = b
                return fn_from_ref, (b,)
        elif t.__module__ == "__main__" or (t is type and obj.__module__ == "__main__"):
            # (The whole call goes by value anyway: no need to pickle the rest first.)
            raise _NotKept
        return NotImplemented


class _NotKept(Exception):
    """Something `_KeptFunctions` cannot write as plain pickle."""


def _dumps_kept(obj) -> tuple[bytes, list] | None:
    """`obj` pickled with its functions that travel by value written as their kept pickles
    (`_KeptFunctions`), or None when nothing else of it may go by value either (another
    reference to `__main__`, a function that is not kept): a call whose arguments hold such
    functions (Dask's batches of tasks, a callback passed as an argument) is not pickled whole
    with cloudpickle, the functions' code again each time."""
    np = sys.modules.get("numpy")
    if np is not None and _ArrayPickler.dispatch_table.get(np.ndarray) is None:
        _ArrayPickler.dispatch_table[np.ndarray] = _reduce_ndarray
    f = io.BytesIO()
    bufs: list = []
    p = _KeptFunctions(f, bufs.append)
    try:
        p.dump(obj)
    except Exception:
        return None
    data = f.getvalue()
    if not p.kept or _names_main(data, obj, p.kept):
        return None
    return data, bufs


def _polars_from_arrow(value):
    import polars

    return polars.from_arrow(value, rechunk=False)


def _reduce_polars(obj):
    return _polars_from_arrow, (obj.to_arrow(),)


def _dumps_with_arrow(obj) -> tuple[bytes, list]:
    import polars

    bufs: list = []
    f = io.BytesIO()
    p = pickle.Pickler(f, 5, buffer_callback=bufs.append)
    table = dict(copyreg.dispatch_table)
    table[polars.DataFrame] = _reduce_polars
    table[polars.Series] = _reduce_polars
    p.dispatch_table = table
    p.dump(obj)
    return f.getvalue(), bufs


class _Sharing:
    """Stands in for a process being started while an object pickles, so that
    `multiprocessing`'s queues, locks, events, shared values and connections can travel to
    pymizu workers (they refuse to pickle otherwise): semaphores travel by name, file
    descriptors through multiprocessing's resource sharer (each pickle read once: a task's
    arguments) or, with `inherit`, by inheritance into workers started afterwards (a pool's
    initializer arguments, read by every worker)."""

    def __init__(self, inherit: bool):
        self.inherit = inherit

    def duplicate_for_child(self, fd: int) -> int:
        if self.inherit:
            import os

            os.set_inheritable(fd, True)
        return fd

    def DupFd(self, fd: int):  # noqa: N802 (multiprocessing's name)
        if self.inherit:
            return _InheritedFd(fd)
        from multiprocessing import resource_sharer

        return resource_sharer.DupFd(fd)


class _InheritedFd:
    """A file descriptor the worker inherited from the pool's owner, under the same number."""

    def __init__(self, fd: int):
        self.fd = fd

    def detach(self) -> int:
        return self.fd


def dumps_sharing(obj, inherit: bool = False) -> tuple[bytes, list]:
    """`dumps(obj)` where multiprocessing objects may travel (see `_Sharing`)."""
    from multiprocessing import context, reduction

    context.set_spawning_popen(_Sharing(inherit))
    try:
        # multiprocessing's pickler: it knows how connections and sockets reduce.
        bufs: list = []
        f = io.BytesIO()
        reduction.ForkingPickler(f, 5, True, bufs.append).dump(obj)
        data = f.getvalue()
    finally:
        context.set_spawning_popen(None)
    if b"__main__" in data and _main.pickle_by_value(data):
        return _dumps_by_value(obj)
    return data, bufs


def _dumps_fallback(obj, error: Exception) -> tuple[bytes, list]:
    if isinstance(error, RuntimeError) and "through inheritance" in str(error):
        from multiprocessing import context

        if context.get_spawning_popen() is None:
            return dumps_sharing(obj)
    # (A lambda or local function among the arguments: its kept pickle, if it has one.)
    kept = _dumps_kept(obj)
    if kept is not None:
        return kept
    try:
        import cloudpickle
    except ImportError:
        raise error from None
    bufs: list = []
    try:
        return cloudpickle.dumps(obj, 5, buffer_callback=bufs.append), bufs
    except Exception:
        raise error from None
