"""The by-value pickles of functions a worker cannot import (lambdas, local functions, what
`_main` says `__main__` cannot lend by name), kept between calls.

Pickling a function by value (cloudpickle) costs ~20 µs and unpickling it in the worker ~7 µs:
ten times a trivial call. A function's by-value pickle holds its code, defaults and closure
and the globals it names, so it can be reused for as long as each of those is still the same
object — and as long as each is something that cannot change in place: a number, a string, a
module, an importable class or function, a tuple of such, or a function that itself travels by
value under the same rule. A function holding anything else (a list, a dict, an array, an
instance, a `__main__` class) is pickled again for each call, so a worker always sees what the
caller sees at the call. The worker keeps the function it unpickled from a given pickle
(`_codec.fn_from_ref`), so a kept pickle is unpickled once per worker.
"""

from __future__ import annotations

import types

_MISSING = object()  # a name the function reads that is not (yet) a global: a builtin
_LIMIT = 4096  # bytes: a kept pickle travels with each call
_SIMPLE = frozenset((int, float, complex, str, bytes, bool, type(None), range))
# function -> (it and the by-value functions it reaches, the globals' names they read, what
# they held, the pickle)
_kept: dict = {}


def kept(fn) -> bytes | None:
    """The pickle `head` keeps for `fn`, if what it holds is unchanged (`_holds`, unrolled:
    this runs at each call)."""
    k = _kept.get(fn)
    if k is None:
        return None
    fns, names, held, b = k
    i = 0
    for f in fns:
        if f.__code__ is not held[i] or f.__defaults__ is not held[i + 1]:
            return None
        i += 2
        for c in f.__closure__ or ():
            try:
                if c.cell_contents is not held[i]:
                    return None
            except ValueError:  # an empty cell
                if held[i] is not _MISSING:
                    return None
            i += 1
    g = fns[0].__globals__
    for n in names:
        if g.get(n, _MISSING) is not held[i]:
            return None
        i += 1
    return b


def head(fn) -> bytes | None:
    """`fn`'s by-value pickle, kept while what it holds is unchanged; None when `fn` holds
    something that can change in place (it is then pickled with each call)."""
    b = kept(fn)
    if b is not None:
        return b
    found = _reach(fn)
    if found is None:
        return None
    fns, names = found
    held = tuple(_holds(fns, names))
    if not all(_fixed(v, fns) for v in held):
        return None
    import cloudpickle

    try:
        b = cloudpickle.dumps(fn, 5)
    except Exception:
        return None
    if len(b) > _LIMIT:
        return None
    if len(_kept) > 1024:
        _kept.clear()
    _kept[fn] = (fns, names, held, b)
    return b


def _holds(fns: tuple, names: tuple):
    """What the by-value pickle of `fns[0]` holds, in a fixed order, to compare by identity."""
    for f in fns:
        yield f.__code__
        yield f.__defaults__
        for c in f.__closure__ or ():
            try:
                yield c.cell_contents
            except ValueError:  # an empty cell
                yield _MISSING
    g = fns[0].__globals__
    for n in names:
        yield g.get(n, _MISSING)


def _reach(fn) -> tuple[tuple, tuple] | None:
    """`fn` and the by-value functions its globals lead to, and the global names they read;
    None when one of them keeps state a pickle would hold that identity cannot watch (keyword
    defaults, attributes, another module's globals)."""
    g = fn.__globals__
    fns: list = []
    names: list[str] = []
    todo = [fn]
    while todo:
        f = todo.pop()
        if f in fns:
            continue
        if f.__globals__ is not g or f.__kwdefaults__ or f.__dict__:
            return None
        fns.append(f)
        for n in _code_names(f.__code__):
            if n in names:
                continue
            names.append(n)
            v = g.get(n)
            if type(v) is types.FunctionType and _travels_by_value(v):
                todo.append(v)
    return tuple(fns), tuple(names)


def _code_names(code) -> list[str]:
    """The global names `code` and the code objects nested in it (lambdas, comprehensions,
    inner functions) read."""
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.extend(_code_names(c))
    return names


def _travels_by_value(f) -> bool:
    """Whether cloudpickle pickles this function by value (its pickle then holds what it holds)."""
    return f.__module__ == "__main__" or "<locals>" in f.__qualname__


def _fixed(v, fns: tuple) -> bool:
    """Whether `v` cannot change without becoming another object, so that identity tells a
    change (`fns`: the by-value functions whose own holdings are watched)."""
    t = type(v)
    if t in _SIMPLE or v is _MISSING or t is types.ModuleType or t is types.BuiltinFunctionType:
        return True
    if t is types.CodeType:
        return True
    if t is tuple or t is frozenset:
        return all(_fixed(x, fns) for x in v)
    if t is types.FunctionType:
        return v in fns or not _travels_by_value(v)
    if isinstance(v, type):
        return v.__module__ != "__main__" and "<locals>" not in v.__qualname__
    return False
