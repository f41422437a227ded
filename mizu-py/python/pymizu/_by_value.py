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

A function made anew for each call (`submit(lambda: f(x))` in a loop) is a new object each
time, with its own defaults and closure: its code, name and the globals it reads are kept
instead, as a `Template` (pickled once, unpickled once per worker), and each call brings, as
its first argument pickled as arguments are (`rebound`), the function's defaults, the contents
of its closure and the values of the globals of a simple kind that only it reads (a loop
variable at a script's top level is a global that changes at each call). The worker makes
the function again from the two. The template of a function that assigns globals holds all
of them, as a whole function's pickle does (what it assigns stays in the worker's copy).
"""

from __future__ import annotations

import opcode
import types
import weakref

# Whether `fns` and the globals `names` of `g` hold what `_holds` found (`held`), each the same
# object: `_still_held(fns, g, names, held)`. (Native: submit checks a kept pickle at each call.)
from ._native import still_held as _still_held

_MISSING = object()  # a name the function reads that is not (yet) a global: a builtin
_LIMIT = 4096  # bytes: a kept pickle travels with each call
_SIMPLE = frozenset((int, float, complex, str, bytes, bool, type(None), range))
# function -> (it and the by-value functions it reaches, the globals' names they read, what
# they held, the pickle)
_kept: dict = {}


def kept(fn) -> bytes | None:
    """The pickle `head` keeps for `fn`, if what it holds is unchanged."""
    k = _kept.get(fn)
    if k is None:
        return None
    fns, names, held, b = k
    return b if _still_held(fns, fns[0].__globals__, names, held) else None


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
    b = _pickled(fn)
    if b is None:
        return None
    if len(_kept) > 1024:
        _kept.clear()
    _kept[fn] = (fns, names, held, b)
    return b


def _pickled(obj) -> bytes | None:
    """`obj` pickled by value (cloudpickle), or None when that fails or the pickle is too
    large to travel with each call."""
    import cloudpickle

    try:
        b = cloudpickle.dumps(obj, 5)
    except Exception:
        return None
    return b if len(b) <= _LIMIT else None


def _holds(fns: tuple, names: tuple, g=None):
    """What the by-value pickle of `fns[0]` holds (the globals those of `g` if given), in a
    fixed order, to compare by identity."""
    for f in fns:
        yield f.__code__
        yield f.__defaults__
        for c in f.__closure__ or ():
            try:
                yield c.cell_contents
            except ValueError:  # an empty cell
                yield _MISSING
    if g is None:
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


class Template:
    """A by-value function without its defaults, its closure and the global variables of a
    simple kind it alone reads (`names`; see `rebound`): called as `template((defaults, cell
    contents, those globals' values), *args, **kwargs)`, it sets those globals, makes the
    function with the rest and calls it."""

    __slots__ = ("fn", "names", "__weakref__")

    def __init__(self, fn, names: tuple = ()):
        self.fn = fn
        self.names = names

    def __reduce__(self):
        return Template, (self.fn, self.names)

    def __call__(self, state, /, *args, **kwargs):
        defaults, contents, values = state
        t = self.fn
        g = t.__globals__
        if values:
            # (This template's own globals: the by-value pickle made them for it.)
            g.update(zip(self.names, values))
        f = types.FunctionType(t.__code__, g, t.__name__, defaults,
                               tuple(map(types.CellType, contents)) if contents else None)
        f.__qualname__ = t.__qualname__
        f.__module__ = t.__module__
        return f(*args, **kwargs)


# id(code) -> (code, the function's globals, the by-value functions its globals lead to but
# itself, the globals' names the template holds, what those held, the names of the globals
# each call brings, the template's pickle)
_templates: dict = {}
# id(function) -> a weak reference to it, for the functions `rebound` made a call of once: a
# function called again is kept whole by `head` (its calls then bring nothing of it).
_once: dict = {}


def rebound(fn) -> tuple[bytes, tuple] | None:
    """`(the pickle of fn's Template, state)` for a call of `fn` as `template(state, *args,
    **kwargs)`, or None when `fn` is to be kept whole (`head`: it was called before, or its
    template cannot be kept)."""
    if fn.__kwdefaults__ or fn.__dict__ or fn.__annotations__:
        return None
    key = id(fn)
    seen = _once.get(key)
    if seen is not None and seen() is fn and fn not in _kept:
        # Called before, and never kept whole: kept whole from now on. (One whose whole pickle
        # went stale, as when a global it reads changes at each call, stays with the template.)
        del _once[key]
        return None
    code = fn.__code__
    contents = ()
    for c in fn.__closure__ or ():
        try:
            contents += (c.cell_contents,)
        except ValueError:  # an empty cell: a template could not bring it back
            return None
    t = _templates.get(id(code))
    if t is None or not _same_template(t, fn):
        t = _new_template(fn)
        if t is None:
            return None
    values = ()
    if t[5]:
        g = fn.__globals__
        values = tuple(g.get(n, _MISSING) for n in t[5])
        for v in values:
            if type(v) not in _SIMPLE:
                return None
    if len(_once) > 256:
        _once.clear()
    _once[key] = weakref.ref(fn)
    return t[6], (fn.__defaults__, contents, values)


def _same_template(t, fn) -> bool:
    """Whether template entry `t` still makes `fn`: the same code, names and globals dict,
    and what the template holds unchanged."""
    code, g, rest, names, held, _, _ = t
    if fn.__code__ is not code or fn.__globals__ is not g or fn.__name__ is not code.co_name:
        return False
    if fn.__qualname__ is not code.co_qualname:
        return False
    return _still_held(rest, g, names, held)


_WRITES_GLOBALS = frozenset(opcode.opmap[n] for n in ("STORE_GLOBAL", "DELETE_GLOBAL"))


def _writes_globals(code) -> bool:
    """Whether `code` or a code object nested in it assigns or deletes a global variable."""
    if not _WRITES_GLOBALS.isdisjoint(code.co_code[::2]):
        return True
    return any(isinstance(c, types.CodeType) and _writes_globals(c) for c in code.co_consts)


def _new_template(fn):
    """A template entry for `fn` (see `_templates`), kept; None when it cannot be kept."""
    code = fn.__code__
    if fn.__name__ is not code.co_name or fn.__qualname__ is not code.co_qualname:
        return None
    found = _reach(fn)
    if found is None:
        return None
    fns, names = found
    rest = fns[1:]
    g = fn.__globals__
    # The globals of a simple kind only `fn` reads (a loop variable at a script's top level)
    # travel with each call; the template holds the others.
    per_call: tuple = ()
    if not _writes_globals(code):
        theirs = {n for f in rest for n in _code_names(f.__code__)}
        per_call = tuple(n for n in _code_names(code)
                         if n not in theirs and type(g.get(n, _MISSING)) in _SIMPLE)
        per_call = tuple(dict.fromkeys(per_call))
        names = tuple(n for n in names if n not in per_call)
    held = tuple(_holds(rest, names, g))
    if not all(_fixed(v, fns) for v in held):
        return None
    n = len(code.co_freevars)
    bare = types.FunctionType(code, g, fn.__name__, None,
                              tuple(types.CellType() for _ in range(n)) if n else None)
    bare.__qualname__ = fn.__qualname__
    bare.__module__ = fn.__module__
    b = _pickled(Template(bare, per_call))
    if b is None:
        return None
    if len(_templates) > 1024:
        _templates.clear()
    t = _templates[id(code)] = (code, g, rest, names, held, per_call, b)
    return t
