"""The cross-language golden corpus (`mizu-wire/tests/corpus/xlang`): every row of the value
mapping, as the bytes one language sends and the value the other must read from them.

`rows.tsv` names each row, the language that writes it, the Python value and the R value. Rows
Python writes: encoding the Python value must give exactly the stored bytes (the R suite
checks that R reads the R value from them). Rows R writes: decoding the stored bytes must give
the Python value, type and bits included (the R suite checks R still writes those bytes).
`MIZU_BLESS=1` rewrites Python's files instead of comparing.
"""

import os

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from pymizu import _native

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "mizu-wire", "tests", "corpus", "xlang")


def rows(writer):
    with open(os.path.join(CORPUS, "rows.tsv"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, by, py, _r = line.rstrip("\n").split("\t")
            if by == writer:
                yield pytest.param(name, py, id=name)


def path(writer, name):
    return os.path.join(CORPUS, f"{writer}-{name}.bin")


def value(expr):
    return eval(expr, {"np": np, "pa": pa, "pd": pd, "pl": pl})


@pytest.mark.parametrize("name,expr", list(rows("py")))
def test_python_writes_the_stored_bytes(name, expr):
    got = _native.xlang_dumps(value(expr))
    if os.environ.get("MIZU_BLESS") == "1":
        with open(path("py", name), "wb") as f:
            f.write(got)
    with open(path("py", name), "rb") as f:
        assert got == f.read(), f"{name}: the encoding changed (MIZU_BLESS=1 rewrites the file)"


def same(got, want) -> bool:
    """Equal in type and value, floats and arrays bit for bit."""
    if isinstance(want, np.ndarray):
        if not (isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape):
            return False
        if want.dtype.kind in "fMm":  # bit for bit: NaN payloads, NaT
            bits = lambda a: np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # noqa: E731
            return np.array_equal(bits(got), bits(want))
        return np.array_equal(got, want)
    if isinstance(want, pa.Array):
        a = pa.array(got)
        return a.type == want.type and a.equals(want)
    if isinstance(want, pa.Table):
        t = pa.table(got)
        return t.schema.names == want.schema.names and t.schema.types == want.schema.types and t.equals(want)
    if isinstance(want, float):
        return type(got) is float and np.float64(got).view(np.uint64) == np.float64(want).view(np.uint64)
    if isinstance(want, list):
        return type(got) is list and len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return type(got) is dict and list(got) == list(want) and all(same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("name,expr", list(rows("r")))
def test_python_reads_what_r_wrote(name, expr):
    with open(path("r", name), "rb") as f:
        got = _native.xlang_loads(f.read())
    want = value(expr)
    assert same(got, want), f"{name}: {got!r} ({type(got).__name__}) is not {want!r}"


def test_every_row_has_its_file_and_no_file_is_unlisted():
    listed = {f"{w}-{p.values[0]}.bin" for w in ("py", "r") for p in rows(w)}
    present = {f for f in os.listdir(CORPUS) if f.endswith(".bin")}
    assert listed == present
    assert len(listed) > 60


def test_malformed_bytes_are_a_clear_error():
    with open(path("r", "data-frame"), "rb") as f:
        good = f.read()
    for bad in [b"", good[:40], good[:-8], b"XX" + good[2:]]:
        with pytest.raises(_native.MizuError, match="truncated|malformed|magic|header"):
            _native.xlang_loads(bad)
