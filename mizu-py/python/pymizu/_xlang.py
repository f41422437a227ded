"""Cross-language tasks: calls that R workers run for Python pools (and Python workers run for
R pools), and the numpy side of the value mapping (`docs/interop.md`). The payloads and the
value codec are `mizu-wire`'s; this module only says what a Python object becomes."""

from __future__ import annotations

import builtins
import importlib
import traceback as _tb
from typing import Any

from . import _rng
from ._errors import TaskError
from .wire import Call

__all__ = ["call", "RError", "RWarning", "PythonTaskError"]


def call(target: str | None = None, /, *args, source: str | None = None, **kwargs) -> Call:
    """A call for a worker of another language (or of this one).

    `call("stats::quantile", x, probs=[.25, .5])` names a function: `pkg::fun` or a name the
    worker finds (R), `module.function` or `module:object.attr` (Python).
    `call(source="y <- x * 2\\ny + 1", x=20)` runs source text with the named arguments bound
    as variables; its value is the last expression's. Arguments are values that cross
    languages (`docs/interop.md`). In `Pool.map`, each element is appended to the arguments.
    """
    if (target is None) == (source is None):
        raise TypeError("call() needs either a target name or source=, not both")
    if source is not None:
        if args:
            raise TypeError("a source call takes named arguments only (they become variables)")
        if not isinstance(source, str):
            raise TypeError("source must be a str")
        return Call(source, True, [], dict(kwargs))
    if not isinstance(target, str) or not target:
        raise TypeError("the call's target must be a non-empty str")
    return Call(target, False, list(args), dict(kwargs))


class RError(TaskError):
    """An R task signalled an error. `classes` are its condition classes (most specific first),
    `call` the R call that signalled it, `traceback` the R call stack."""

    def __init__(self, classes: list, message: str, call: str = "", traceback: str = ""):
        name = classes[0] if classes else "error"
        super().__init__(name, message, traceback)
        self.classes = list(classes)
        self.call = call

    def __str__(self) -> str:
        where = f" (in {self.call})" if self.call else ""
        return f"R error{where}: {self.message}"

    def __reduce__(self):
        return (type(self), (self.classes, self.message, self.call, self.traceback))


class RWarning(UserWarning):
    """A warning an R task raised (issued again in the caller when its value is collected)."""


def warn_r(messages: list) -> None:
    import warnings

    for m in messages:
        warnings.warn(RWarning(m), stacklevel=3)


class PythonTaskError(TaskError):
    """A Python exception from a task of another pool's language (seen from Python only in
    tests: R callers get a classed condition)."""


def remote_error(language: str, classes: list, message: str, call: str, traceback: str) -> Exception:
    """The exception a Python caller gets for a failed cross-language task."""
    if language == "r":
        return RError(classes, message, call, traceback)
    e = PythonTaskError(classes[0] if classes else "Exception", message, traceback)
    e.classes = list(classes)
    return e


# -- the worker's side --------------------------------------------------------------------


def _resolve(target: str):
    """The object a qualified name names: `module:attr.path`, or `module.attr` (the longest
    importable module prefix)."""
    if ":" in target:
        mod, _, path = target.partition(":")
        obj = importlib.import_module(mod)
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj
    parts = target.split(".")
    if len(parts) == 1:
        if hasattr(builtins, target):
            return getattr(builtins, target)
        raise NameError(f"name {target!r} is not a builtin: name a module too (module.function)")
    for k in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError:
            continue
        for part in parts[k:]:
            obj = getattr(obj, part)
        return obj
    raise ModuleNotFoundError(f"no module found for {target!r}")


_fns: dict[str, Any] = {}


def _run_source(code: str, kwargs: dict):
    import ast

    tree = ast.parse(code, "<mizu source>", "exec")
    env = {"__name__": "__mizu_source__", "__builtins__": builtins}
    env.update(kwargs)
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
        exec(compile(tree, "<mizu source>", "exec"), env)
        return eval(compile(ast.Expression(last.value), "<mizu source>", "eval"), env)
    exec(compile(tree, "<mizu source>", "exec"), env)
    return None


def resolve(target: str):
    """The function a task names (cached)."""
    fn = _fns.get(target)
    if fn is None:
        fn = _resolve(target)
        if len(_fns) > 1024:
            _fns.clear()
        _fns[target] = fn
    return fn


def run(target: str, source: bool, args: list, kwargs: dict, seed, index: int):
    """Runs one cross-language task in a Python worker."""
    if seed is not None:
        _rng.enter(seed, index)
    try:
        if source:
            return _run_source(target, kwargs)
        return resolve(target)(*args, **kwargs)
    finally:
        if seed is not None:
            _rng.leave()


def run_chunk(target: str, args: list, kwargs: dict, elements: list, spread: bool, seed, start: int) -> list:
    """Runs a cross-language map chunk in a Python worker: element `j` (index `start + j` in the
    map) is appended to the arguments (its items, when `spread`) and runs on the stream
    `(seed, start + j)`. A failing element's exception carries its index (`_pymizu_element`)."""
    fn = resolve(target)
    out = []
    append = out.append
    i = start
    try:
        if seed is None and not args and not kwargs and not spread:
            for x in elements:
                append(fn(x))
                i += 1
            return out
        for x in elements:
            a = (*args, *x) if spread else (*args, x)
            if seed is not None:
                _rng.enter(seed, i)
            try:
                append(fn(*a, **kwargs))
            finally:
                if seed is not None:
                    _rng.leave()
            i += 1
    except BaseException as e:
        try:
            e._pymizu_element = i  # type: ignore[attr-defined]
        except Exception:
            pass
        raise
    return out


def describe(e: BaseException, tb=None) -> tuple[list, str, str]:
    """(classes, message, traceback) of a task's exception, for a caller of another language."""
    classes = [c.__qualname__ for c in type(e).__mro__ if c not in (object, BaseException)]
    tb = "".join(_tb.format_exception(type(e), e, tb if tb is not None else e.__traceback__))
    return classes, str(e), tb


# -- numpy arrays -------------------------------------------------------------------------


def ndarray_parts(a):
    """How a numpy array crosses: `(code, flat, n, dim, valid, meta)` where `flat` is a 1-D,
    aligned, native-order array (or a list of strings for `utf8`), `dim` the shape when the
    array is not 1-D (then `flat` is its column-major order, as R lays out arrays), `valid` a
    little-endian validity bitmap (packed bits) or None, `meta` extra field metadata."""
    import numpy as np

    dt = a.dtype
    if dt.hasobject:
        raise TypeError("an object-dtype array cannot cross languages (convert it to a typed dtype)")
    dim = list(a.shape) if a.ndim != 1 else None
    flat = a.ravel(order="F") if a.ndim != 1 else a
    n = flat.shape[0]
    k = dt.kind
    valid = None
    meta: list = []

    def native(x, t):
        x = np.ascontiguousarray(x, dtype=t)
        if not x.flags.aligned:
            x = x.copy()
        return x

    if k == "b":
        return "bool", np.packbits(flat.astype(np.bool_), bitorder="little"), n, dim, None, meta
    if k in "iu":
        size = dt.itemsize
        if k == "u" and size == 1:
            return "u8", native(flat, np.uint8), n, dim, None, meta
        if (k == "i" and size <= 4) or (k == "u" and size == 2):
            return "i32", native(flat, np.int32), n, dim, None, meta
        if k == "i":
            x = native(flat, np.int64)
            nulls = x == np.iinfo(np.int64).min
            if nulls.any():
                valid = np.packbits(~nulls, bitorder="little")
            return "i64", x, n, dim, valid, meta
        # uint32 and uint64 become doubles: exact up to 2**53.
        if size == 8 and n and int(flat.max()) > 2**53:
            import warnings

            warnings.warn("uint64 values above 2**53 lose precision as doubles", stacklevel=4)
        return "f64", native(flat, np.float64), n, dim, None, meta
    if k == "f":
        if dt.itemsize > 8:
            raise TypeError(f"a {dt} array cannot cross languages exactly (use float64)")
        return "f64", native(flat, np.float64), n, dim, None, meta
    if k == "c":
        raise TypeError("complex arrays cannot cross languages yet (send real and imaginary parts)")
    if k in "Mm":
        unit = np.datetime_data(dt)[0]
        x = flat.view(np.int64)
        nat = x == np.iinfo(np.int64).min
        if nat.any():
            valid = np.packbits(~nat, bitorder="little")
        if k == "M" and unit == "D":
            days = native(np.where(nat, 0, x), np.int32)
            return "date32", days, n, dim, valid, meta
        us = flat.astype(f"{k}8[us]").view(np.int64)
        return ("timestamp" if k == "M" else "duration"), native(us, np.int64), n, dim, valid, meta
    if k in "US":
        items = flat.tolist()
        if k == "S":
            items = [b.decode("utf-8") for b in items]
        return "utf8", items, n, dim, None, meta
    raise TypeError(f"a {dt} array cannot cross languages")


def view(buf, dtype: str, dim):
    """A read-only numpy array over received Arrow values (`buf` a shared buffer)."""
    import numpy as np

    a = np.frombuffer(buf, dtype=dtype)
    if dim is not None:
        a = a.reshape(dim, order="F")
    return a



def strings(items: list, dim):
    """A numpy str array of received strings (without nulls)."""
    import numpy as np

    a = np.array(items, dtype=str) if items else np.array([], dtype="<U1")
    if dim is not None:
        a = a.reshape(dim, order="F")
    return a
