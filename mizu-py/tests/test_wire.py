"""The cross-language format from Python: the golden corpus round-trips byte for byte, and Arrow
data crosses to pyarrow and polars through the PyCapsule interface."""

import math
import os

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import pymizu
from pymizu import wire

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "mizu-wire", "tests", "corpus")


def corpus_files():
    return sorted(f for f in os.listdir(CORPUS) if f.endswith(".bin") and f != "region-frame.bin")


@pytest.mark.parametrize("name", corpus_files())
def test_the_golden_corpus_round_trips_byte_for_byte(name):
    with open(os.path.join(CORPUS, name), "rb") as f:
        data = f.read()
    value, aux = wire.loads(data)
    assert wire.dumps(value, aux) == data


def test_scalars_and_containers_decode_to_python_values():
    read = lambda name: wire.loads(open(os.path.join(CORPUS, name + ".bin"), "rb").read())[0]  # noqa: E731
    assert read("none") is None and read("true") is True and read("false") is False
    assert read("int-max") == 2**63 - 1 and read("int-negative") == -42
    assert read("float-pi") == math.pi
    na = read("float-na-real")
    assert math.isnan(na) and np.float64(na).view(np.uint64) == 0x7FF00000000007A2, "R's NA_real_ bit-exact"
    assert read("str-utf8") == "mizu 水 ✓"
    assert isinstance(read("error"), pymizu.TaskError)
    call = read("call-name")
    assert isinstance(call, wire.Call) and not call.source


def test_python_values_round_trip():
    v = {"a": [1, 2.5, None, True, "x", b"\x00\xff", 1 + 2j], "b": {"c": []}}
    got, aux = wire.loads(wire.dumps(v, aux=7))
    assert aux == 7
    assert got == {"a": [1, 2.5, None, True, "x", b"\x00\xff", 1 + 2j], "b": {"c": []}}
    assert wire.loads(wire.dumps((1, 2)))[0] == [1, 2]


def test_what_cannot_cross_is_a_clear_error():
    with pytest.raises(TypeError, match="cannot cross"):
        wire.dumps(object())
    with pytest.raises(TypeError, match="str"):
        wire.dumps({1: 2})
    with pytest.raises(ValueError, match="64-bit"):
        wire.dumps(2**70)
    for bad in [b"", b"XX" + b"\x00" * 20, open(os.path.join(CORPUS, "region-frame.bin"), "rb").read()]:
        with pytest.raises(ValueError):
            wire.loads(bad)


def test_arrow_arrays_and_tables_cross_to_pyarrow_and_polars():
    frame = open(os.path.join(CORPUS, "r-data-frame.bin"), "rb").read()
    t, _ = wire.loads(frame)
    assert isinstance(t, wire.ArrowTable) and t.num_rows == 3
    pt = pa.table(t)  # __arrow_c_stream__
    assert pt.column_names == t.column_names
    assert pt.column("n").to_pylist() == [1, None, 3]
    assert pt.column("s").to_pylist() == ["a", None, "水"]
    assert pt.schema.field("f").metadata, "R metadata rides along"
    df = pl.DataFrame(t)
    assert df.shape == (3, 5)
    rb = pa.record_batch(t)  # __arrow_c_array__
    assert rb.num_rows == 3
    a, _ = wire.loads(open(os.path.join(CORPUS, "array-int32-nulls.bin"), "rb").read())
    assert isinstance(a, wire.ArrowArray)
    assert pa.array(a).null_count == 1


def test_arrow_producers_encode_and_come_back_equal():
    pt = pa.table({"x": np.arange(100_000, dtype=np.int64), "y": pa.array([None, "b"] * 50_000)})
    t, _ = wire.loads(wire.dumps(pt))
    assert pa.table(t).equals(pt)
    df = pl.DataFrame({"a": [1.5, None, 3.0], "s": ["x", "y", None]})
    t2, _ = wire.loads(wire.dumps(df))
    assert pl.DataFrame(t2).equals(df)
    arr = pa.array(np.linspace(0, 1, 1000))
    a, _ = wire.loads(wire.dumps(arr))
    assert pa.array(a).equals(arr)
    s = pl.Series("v", [1, 2, None])
    a2, _ = wire.loads(wire.dumps(s))
    assert isinstance(a2, wire.ArrowArray) and pl.Series(a2).to_list() == [1, 2, None]
    chunked = pa.chunked_array([[1, 2], [3]])
    a3, _ = wire.loads(wire.dumps(chunked))
    assert pa.array(a3).to_pylist() == [1, 2, 3]


def test_exported_arrow_data_stays_alive_after_the_source_is_gone():
    pt = pa.table({"x": np.arange(1000)})
    t, _ = wire.loads(wire.dumps(pt))
    consumer = pa.table(t)
    del t
    import gc

    gc.collect()
    assert consumer.column("x").to_pylist()[-1] == 999


def test_a_frame_in_shared_memory_is_decoded_from_the_view():
    import pickle
    import struct

    from pymizu import _native

    frame = wire.dumps(pa.table({"x": np.arange(10_000)}))
    pk = pickle.dumps(None)
    off = -(-(16 + 24 + len(pk)) // 64) * 64
    payload = b"p\0\0\0" + struct.pack("<IQQQQ", 1, len(pk), off, len(frame), 0) + pk
    payload += b"\0" * (off - len(payload)) + frame
    _, bufs = _native.decode_payload(payload)
    assert type(bufs[0]).__name__ == "ShmBuffer"
    t, _ = wire.loads(bufs[0])
    assert pa.table(t).column("x").to_pylist()[-1] == 9999
