"""The cross-language value format (what R and Python workers exchange; `docs/wire-format.md`).

`dumps(obj, aux=0) -> bytes` encodes one frame; `loads(frame) -> (obj, aux)` decodes one.
Values: None, bool, int (64-bit), float (bit-exact, R's NA_real_ included), complex, str,
bytes, list/tuple (decoded as list), dict with str keys, `TaskError` (a remote error), `Call`
(a function reference or source with arguments), and Arrow data: anything exporting the Arrow
PyCapsule interface (pyarrow arrays and tables, polars frames and series, ...) is encoded as
Arrow IPC; decoded Arrow data is an `ArrowArray` or `ArrowTable`, which any Arrow consumer
takes without copying (`pyarrow.array(a)`, `pyarrow.table(t)`, `polars.DataFrame(t)`), R
metadata (factor levels, Date, POSIXct time zone, ...) riding in the field metadata.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._native import ArrowArray, ArrowTable, wire_dumps, wire_loads

__all__ = ["ArrowArray", "ArrowTable", "Call", "dumps", "loads"]


class Call(NamedTuple):
    """A call value: `target` is a qualified name (`package.module:function`, `pkg::fun`)
    or, with `source=True`, source text evaluating to the function."""

    target: str
    source: bool
    args: list
    kwargs: dict


def dumps(obj: Any, aux: int = 0) -> bytes:
    """One frame of the cross-language format holding `obj` (`TypeError` for what cannot
    cross languages, `ValueError` for out-of-range values)."""
    return wire_dumps(obj, aux)


def loads(frame) -> tuple[Any, int]:
    """`(value, aux)` from one inline frame (bytes-like); malformed input is a `ValueError`."""
    return wire_loads(frame)
