"""Chunks of calls: how a map's elements travel (`map_items`, `chunk_of`), what runs inside
workers for a map's chunk (`_run_chunk`) and for a chunk of `Pool.submit_batch` (`_run_batch`),
whose calls fail one by one, and how their results come back to each call's task."""

from __future__ import annotations

import itertools
import pickle
# (Annotations only: typing costs a worker's start-up ~9 ms.)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from . import _codec, _native, _rng, _share


def map_items(iterables: tuple, python_workers: bool = True) -> tuple[list | tuple, bool]:
    """A map's elements, and whether each is a tuple of arguments: one iterable's as a list
    (`fn(x)`), several as the tuples `zip` makes. For Python workers, several sized iterables
    travel as columns instead — a tuple of lists, cut to the shortest, as `zip` pairs them —
    which are cheaper to make and to pickle than a tuple per element, and a large argument
    repeated across elements goes shared (`_share.share_repeated`), once for the map."""
    keep = _share.share_repeated if python_workers else (lambda items, star: items)
    if len(iterables) == 1:
        return keep(list(iterables[0]), False), False
    if python_workers and iterables and all(hasattr(it, "__len__") for it in iterables):
        n = min(len(it) for it in iterables)
        return tuple(keep(list(itertools.islice(it, n)), False) for it in iterables), True
    return keep(list(zip(*iterables)), True), True


def items_len(items: list | tuple) -> int:
    """How many elements `map_items` made."""
    return (min(map(len, items)) if items else 0) if type(items) is tuple else len(items)


def chunk_of(items: list | tuple, s: int, k: int) -> list | tuple:
    """Elements `s` to `s + k` of `map_items`'s, in its form."""
    if type(items) is tuple:
        return tuple(c[s : s + k] for c in items)
    return items[s : s + k]


def _run_chunk(fn, start: int, items: list | tuple, star: bool, seed: int | None, offset: int) -> list:
    """Runs a map chunk inside a worker; an element's exception carries its index."""
    if seed is None:
        return _native.run_calls(fn, items, star, start)
    out = []
    append = out.append
    i = start
    try:
        for x in zip(*items) if type(items) is tuple else items:
            _rng.enter(seed, offset + i)
            try:
                append(fn(*x) if star else fn(x))
            finally:
                _rng.leave()
            i += 1
    except BaseException as e:
        try:
            e._pymizu_index = i  # type: ignore[attr-defined]
        except Exception:
            pass
        raise
    return out


def _run_chunk_ref(head: bytes, start: int, items: list | tuple, star: bool, seed: int | None,
                   offset: int) -> list:
    """`_run_chunk` of the function whose pickle `_codec.fn_ref` kept as `head`: unpickled once
    per worker, not with every chunk."""
    return _run_chunk(_codec.fn_from_ref(head), start, items, star, seed, offset)


def chunk_call(fn, ref: bytes | None, start: int, items: list | tuple, star: bool, seed: int | None,
               offset: int) -> tuple[bytes, list, bytes | None]:
    """The pickled call of a map's chunk: with `ref` (`_codec.fn_ref(fn)`, taken once per
    map), the function travels as that kept pickle — a function that goes by value (a lambda,
    what `__main__` defines in a notebook) is not pickled again by value with each chunk, and
    the chunk's elements are pickled as plain data."""
    if ref is not None:
        return _codec.dumps_call(_run_chunk_ref, (ref, start, items, star, seed, offset), {})
    return _codec.dumps_call(_run_chunk, (fn, start, items, star, seed, offset), {})


# (In a worker) the list the last chunk returned, until its result is pickled: a call's
# value that cannot be pickled then fails that call alone.
_batch_out = None


class _Batch(list):
    """A chunk's values when some of its calls failed; `errors` maps a call's position to its
    pickled `(exception, traceback)` (its value is None)."""

    errors: dict


def _failure(e: BaseException, tb: str) -> bytes:
    try:
        return pickle.dumps((e, tb), protocol=5)
    except Exception:
        from ._errors import TaskError

        return pickle.dumps((TaskError(type(e).__qualname__, str(e), tb), tb), protocol=5)


def _run_batch(fn, calls: list, skip) -> list:
    """Runs the calls of a chunk of `Pool.submit_batch` inside a worker (those at positions in
    `skip` were cancelled: their values are None)."""
    if not skip:
        return _batch_done(*_native.run_batch_calls(fn, calls))
    out = []
    append = out.append
    errors = None
    it = iter(calls)
    while True:
        try:
            for args in it:
                append(None if len(out) in skip else fn(*args))
            break
        except BaseException as e:  # the call's outcome, as a task's
            if errors is None:
                errors = {}
            errors[len(out)] = _failure(e, _traceback())
            append(None)
    return _batch_done(out, errors)


def _batch_done(out: list, errors: dict | None) -> list:
    """(In a worker) what a chunk returns: its values, and its calls' failures if any."""
    global _batch_out
    if errors is not None:
        out = _Batch(out)
        out.errors = errors
    _batch_out = out
    return out


def _traceback() -> str:
    """The traceback of the exception being handled (`traceback`, imported when a call first
    fails, costs a worker's start-up ~2 ms)."""
    import traceback

    return traceback.format_exc()


def _batch_failure(e: BaseException) -> bytes:
    """(In a worker) the failure of a call of a chunk `_native.run_batch_calls` ran."""
    import traceback

    return _failure(e, "".join(traceback.format_exception(type(e), e, e.__traceback__)))


def _run_batch_ref(head: bytes, calls: list, skip) -> list:
    """`_run_batch` of the function pickled by reference as `head` (`_codec.fn_ref`): the
    chunk's call is then small values only, written natively."""
    return _run_batch(_codec.fn_from_ref(head), calls, skip)


def _batch_result(value):
    """(In a worker) `value`, the list a chunk returned, whose pickling failed: the values that
    cannot be pickled become their calls' failures."""
    errors = dict(getattr(value, "errors", {}))
    out = _Batch(value)
    for i, v in enumerate(value):
        if i in errors:
            continue
        try:
            _codec.dumps(v)
        except Exception as e:
            errors[i] = _failure(e, _traceback())
            out[i] = None
    out.errors = errors
    return out


def _batch_element(values: _Batch, i: int) -> tuple[bool, Any]:
    """(ok, value or exception) of call `i` of a chunk some of whose calls failed."""
    b = values.errors.get(i)
    if b is None:
        return True, values[i]
    from ._outcome import decode

    return decode(1, b, [], 0, 0)


def _batch_payload(fn, calls: list, skip: list) -> tuple[bytes, list, bytes | None]:
    """The pickled call of a chunk, leaving out the calls at positions `skip` (cancelled)."""
    return _codec.dumps_call(_run_batch, (fn, calls, frozenset(skip)), {})
