"""The caller's `__main__` as a worker sees it.

A worker imports the caller's script (as `__mp_main__`, so its `if __name__ == "__main__":`
block does not run) or the module run with `-m`, and finds the functions and classes the caller
pickled by name there. What it cannot find that way travels by value (cloudpickle):

* everything `__main__` defines when there is nothing to import: the REPL, `python -c`, a script
  read from stdin, a Jupyter kernel, `python -m package`, a zip or directory run as a program;
* everything a script defines when it has no `__main__` guard: importing it would run the
  whole program again in each worker, so the worker does not import it;
* what a guarded script defines only under its guard (not there when a worker imports the
  script), and the script's functions and classes that read, themselves or through its other
  functions, a global the guard binds (`FACTOR = 3` under the guard: by name, the worker's
  copy would find it unset, or with its value from outside the guard).

The script is read once, with `ast`; nothing of it runs here.
"""

from __future__ import annotations

import os
import sys

_NONE: frozenset = frozenset()
_EVERYTHING = (None, None, True, _NONE, ())
_seen: object = ()  # the `__main__` module the verdict below is about
_verdict: tuple = _EVERYTHING


def _verdict_now() -> tuple:
    """`(script path, module name, everything by value, names by value, what each of those
    names looks like in a pickle)` for `__main__`."""
    global _seen, _verdict
    main = sys.modules.get("__main__")
    if main is _seen:
        return _verdict
    _seen, _verdict = main, _read(main)
    return _verdict


def _read(main) -> tuple:
    file = getattr(main, "__file__", None)
    if main is None or not file or "ipykernel" in sys.modules or not os.path.isfile(file):
        return _EVERYTHING
    spec = getattr(main, "__spec__", None)
    module = None
    if spec is not None:
        module = spec.name
        if module == "pymizu.worker":
            return (None, None, False, _NONE, ())
        if module == "__main__" or module.endswith(".__main__"):
            # `python -m package` (`-m unittest`, `-m pytest`): importing the package's
            # `__main__` would run the program again; multiprocessing skips it too.
            return _EVERYTHING
    names = _by_value_names(file)
    if names is None:
        return _EVERYTHING
    return (None if module else os.path.abspath(file), module, False, names, _patterns(names))


def _patterns(names: frozenset) -> tuple:
    """Bytes of which one is in any pickle naming one of `names`: the name as a pickled string
    (written whole the first time it appears in a pickle, memoized after), or as the first part
    of a qualified name."""
    out = []
    for n in names:
        b = n.encode()
        out.append((b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + len(b).to_bytes(4, "little")) + b)
        out.append(b + b".")
    return tuple(out)


def _by_value_names(file: str) -> frozenset | None:
    """The top-level names of the script that must travel by value (see the module's doc);
    None when it has no top-level `__main__` guard."""
    import ast

    try:
        with open(file, "rb") as f:
            tree = ast.parse(f.read(), file)
    except (OSError, SyntaxError, ValueError):
        return None
    inside: set[str] = set()
    outside: set[str] = set()
    defined_inside: set[str] = set()  # functions and classes
    reads: dict[str, set[str]] = {}  # a top-level function or class -> the names it reads
    guarded = False
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and _is_guard(stmt.test):
            guarded = True
            _bind(stmt.body, inside, defined_inside)
            _bind(stmt.orelse, outside, set())
            continue
        _bind([stmt], outside, set())
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            reads.setdefault(stmt.name, set()).update(_global_reads(stmt))
    if not guarded:
        return None
    # Only functions and classes are pickled by name (a variable's value is pickled itself).
    out = defined_inside - outside
    # Those that read a name the guard binds, then those that read one of them, and so on.
    grew = True
    while grew:
        grew = False
        for name, read in reads.items():
            if name not in out and not read.isdisjoint(inside | out):
                out.add(name)
                grew = True
    return frozenset(out)


def _global_reads(defn) -> set[str]:
    """The names a function or class definition reads and does not bind itself (nested scopes
    taken together: close enough, and an extra name only sends a function by value)."""
    import ast

    loads: set[str] = set()
    local: set[str] = set()
    declared: set[str] = set()
    for n in ast.walk(defn):
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else local).add(n.id)
        elif isinstance(n, ast.arg):
            local.add(n.arg)
        elif isinstance(n, ast.Global):
            declared.update(n.names)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            local.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not defn:
            local.add(n.name)
    return (loads - local) | (loads & declared)


def _is_guard(test) -> bool:
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = (test.left, test.comparators[0])
    has_name = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    has_main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return has_name and has_main


def _bind(stmts, into: set, defs: set) -> None:
    """The module-level names `stmts` bind into `into`, those of functions and classes also
    into `defs` (function and class bodies are their own scopes)."""
    import ast

    for stmt in stmts:
        for node in _walk_scope(stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                into.add(node.name)
                defs.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                into.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    into.add((a.asname or a.name).split(".")[0])


def _walk_scope(node):
    """`ast.walk` that does not enter nested scopes (their bindings are not the module's)."""
    import ast

    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            # A definition's decorators and defaults run in the module's scope, its body does not.
            todo.extend(getattr(n, "decorator_list", ()))
            args = getattr(n, "args", None)
            if args is not None:
                todo.extend(args.defaults)
                todo.extend(d for d in args.kw_defaults if d is not None)
            continue
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        todo.extend(ast.iter_child_nodes(n))


def where() -> tuple[str | None, str | None]:
    """Where a worker finds the caller's `__main__`: `(script path, None)`, `(None, module
    name)`, or `(None, None)` when it should not import it."""
    v = _verdict_now()
    return v[0], v[1]


def by_value(obj) -> bool:
    """Whether `__main__`'s function or class `obj` must travel by value."""
    v = _verdict_now()
    return v[2] or obj.__qualname__.split(".", 1)[0] in v[3]


def pickle_by_value(data: bytes) -> bool:
    """Whether a pickle (protocol 5) naming `__main__` objects must be redone by value: it holds
    a string that names one of those that must (a string that only happens to be spelled so
    costs a pickling by value, which is always right)."""
    v = _verdict_now()
    return v[2] or any(p in data for p in v[4])
