"""The native fast path for small calls and results: what qualifies crosses with its exact
type and value, what does not goes through pickle unchanged, malformed payloads are refused
with ValueError — and a kept outcome is the same object every time it is asked for."""

import enum
import math
import random
import threading

import numpy as np
import pytest

import pymizu
import tasks
from pymizu import _native


@pytest.fixture(scope="module")
def pool():
    with pymizu.Pool(2) as p:
        yield p


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


SMALL = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    1.5,
    -0.0,
    float("inf"),
    "",
    "héllo ✓",
    b"",
    b"\x00\xff",
    (),
    (1,),
    [],
    [1, "a", None],
    {},
    {"a": 1, (1, 2): [3.0], 5: {"x": b"y"}},
    ((((1,),),),),
]

NOT_SMALL = [
    2**63,  # beyond 64 bits
    -(2**63) - 1,
    Color.RED,  # an int subclass keeps its type through pickle
    MyStr("x"),
    "\ud800",  # a lone surrogate
    {1, 2},
    frozenset(),
    bytearray(b"x"),
    1 + 2j,
    [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]],  # nested deeper than the fast path goes
]


@pytest.mark.parametrize("v", SMALL, ids=repr)
def test_small_values_encode_and_decode_exactly(v):
    b = _native.small_dumps(v)
    assert b is not None
    back = _native.small_loads(b)
    assert back == v and type(back) is type(v)
    if isinstance(v, float):
        assert math.copysign(1, back) == math.copysign(1, v)


@pytest.mark.parametrize("v", NOT_SMALL, ids=repr)
def test_other_values_are_left_to_pickle(v):
    assert _native.small_dumps(v) is None


def test_a_mutable_container_seen_twice_is_left_to_pickle():
    inner = [1]
    assert _native.small_dumps([inner, inner]) is None
    assert _native.small_dumps({"a": inner, "b": inner}) is None
    assert _native.small_dumps([[1], [1]]) is not None  # equal, not shared


def test_nan_crosses():
    assert math.isnan(_native.small_loads(_native.small_dumps(float("nan"))))


@pytest.mark.parametrize("v", SMALL + NOT_SMALL, ids=repr)
def test_every_value_round_trips_through_a_worker_with_its_type(pool, v):
    back = pool.submit(tasks.ident, v).result(timeout=60)
    if isinstance(v, float) and math.isnan(v):
        assert math.isnan(back)
    else:
        assert back == v and type(back) is type(v)


def test_outcomes_of_every_size_around_the_by_value_limit_arrive_exact(pool):
    # An outcome of up to a few dozen bytes is taken out of its slot by value, a longer one
    # into a buffer: every length on either side, of each kind of outcome, arrives the same.
    for n in range(0, 80):
        s = "x" * n
        b = bytes(range(n))
        arr = np.arange(n, dtype=np.uint8)
        assert pool.submit(tasks.ident, s).result(timeout=60) == s
        assert pool.submit(tasks.ident, b).result(timeout=60) == b
        assert pool.submit(tasks.ident, (n, s)).result(timeout=60) == (n, s)
        back = pool.submit(tasks.ident, arr).result(timeout=60)
        assert back.dtype == arr.dtype and np.array_equal(back, arr)
        assert pool.submit(tasks.ident, {1, n}).result(timeout=60) == {1, n}  # pickled
        with pytest.raises(ValueError, match=s or "^$"):
            pool.submit(tasks.boom, s).result(timeout=60)


def test_shared_references_survive_a_worker_round_trip(pool):
    inner = [1]
    a, b = pool.submit(tasks.ident, [inner, inner]).result(timeout=60)
    assert a is b


def test_keyword_arguments_and_exceptions_of_small_calls(pool):
    assert pool.submit(tasks.add, a=2, b=3).result(timeout=60) == 5
    assert pool.submit(tasks.add, 2, b=3).result(timeout=60) == 5
    with pytest.raises(TypeError):
        pool.submit(tasks.add, 1, c=2).result(timeout=60)
    t = pool.submit(tasks.boom, "small")
    with pytest.raises(ValueError, match="small") as info:
        t.result(timeout=60)
    assert "boom" in str(info.value.__cause__)  # the remote traceback names the function


def test_a_result_that_is_not_small_is_pickled_and_an_unpicklable_one_raises(pool):
    assert pool.submit(tasks.ident, {1, 2}).result(timeout=60) == {1, 2}
    with pytest.raises(TypeError, match="pickle"):
        pool.submit(tasks.make_lock).result(timeout=60)
    with pytest.raises(pymizu.TaskError, match="Unpicklable"):
        pool.submit(tasks.raise_unpicklable).result(timeout=60)
    assert pool.submit(tasks.add, 1, 1).result(timeout=60) == 2  # the worker goes on


def test_an_outcome_is_kept_and_is_the_same_object_every_time(pool):
    t = pool.submit(tasks.ident, [1, 2])
    first = t.result(timeout=60)
    assert t.result() is first and t.result(0) is first
    e = pool.submit(tasks.boom, "once")
    with pytest.raises(ValueError) as a:
        e.result(timeout=60)
    with pytest.raises(ValueError) as b:
        e.result(timeout=60)
    assert a.value is b.value and e.exception() is a.value


def test_many_threads_waiting_on_one_task_all_get_its_value(pool):
    t = pool.submit(tasks.sleep, 0.3)
    got = []
    threads = [threading.Thread(target=lambda: got.append(t.result(timeout=60))) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert got == [0.3] * 8


def test_malformed_small_payloads_raise_value_error_never_crash():
    # Items of the wire format's compact encoding (docs/wire-format.md §3).
    bad = [
        b"",
        b"K",
        b"k",  # a buffer table cut short
        b"K\x7f",  # unknown tag
        b"K\x00\x00",  # trailing bytes
        b"K\x03\x01",  # truncated int
        b"K\x06\xff\xff\xff\xff\x0f",  # length beyond the payload
        b"K\x10\xff\xff\xff\x7f",  # count beyond the payload
        b"K\x11\x01\x08\x00\x00",  # an unhashable key (a list)
        b"K\x06\x02\xc3\x28",  # not UTF-8
        b"K\x09\x01\x01\xff\x00",  # a dict key that is not UTF-8
        b"K" + b"\x10\x01" * 100 + b"\x00",  # nested too deep
        b"K\x07\x40" + b"\x01" * 63 + bytes(64),  # non-zero padding before long bytes
        b"K\x0c\x00",  # an Arrow array (not in Python's same-language payloads)
        b"K\x0b\x02\x05fn",  # function pickle beyond the payload
        b"K\x0b\x00\x02fn\x00\x00",  # a call by name, not of a pickled function
        b"K\x0b\x02\x02fn\x00",  # no keyword count
        b"K\x0b\x02\x02fn\x00\x01\x01\xff\x00",  # a keyword that is not UTF-8
        b"K\x0b\x02\x02fn\x00\x00\x00",  # trailing bytes
    ]
    for b in bad:
        with pytest.raises(ValueError):
            _native.small_loads(b)
    # `K` holding a call item of a pickled function: its bytes, the arguments, the keywords.
    call = b"K\x0b\x02\x02fn" + _native.small_dumps((1, "x", [2.0]))[2:] + b"\x00"
    assert _native.small_loads(call) == (b"fn", (1, "x", [2.0]), None)
    kw = b"K\x0b\x02\x02fn\x00\x01\x01k\x03" + (5).to_bytes(8, "little")
    assert _native.small_loads(kw) == (b"fn", (), {"k": 5})
    # The shared items are the ones every reader of the format understands.
    assert _native.small_dumps([None, True, 7, "é"]) == (
        b"K\x08\x04\x00\x02\x03" + (7).to_bytes(8, "little") + b"\x06\x02" + "é".encode()
    )
    assert _native.small_dumps({"a": 1.5})[:4] == b"K\x09\x01\x01"
    # Random mutations of valid payloads: each decodes or raises ValueError, nothing else.
    rng = random.Random(7)
    decoded = refused = 0
    for g in [_native.small_dumps(v) for v in SMALL] + [call]:
        for _ in range(300):
            b = bytearray(g)
            for _ in range(rng.randint(1, 4)):
                op = rng.randrange(3)
                if op == 0 and len(b) > 1:
                    b[rng.randrange(1, len(b))] = rng.randrange(256)
                elif op == 1 and len(b) > 1:
                    del b[rng.randrange(1, len(b)) :]
                else:
                    b.insert(rng.randrange(1, len(b) + 1), rng.randrange(256))
            try:
                _native.small_loads(bytes(b))
                decoded += 1
            except ValueError:
                refused += 1
    assert refused > 0 and decoded + refused == 300 * (len(SMALL) + 1)


ARRAY_CASES = [
    np.arange(5, dtype=np.int64),
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12, dtype=np.uint16).reshape(3, 4)),
    np.array([True, False]),
    np.array([1 + 2j], dtype=np.complex128),
    np.array(["2024-01-01"], dtype="datetime64[ns]"),
    np.array([3], dtype="timedelta64[s]"),
    np.array(["ab", "c"], dtype="U2"),
    np.array([b"x"], dtype="S1"),
    np.arange(4, dtype=">i4"),  # big-endian stays big-endian
    np.zeros((0, 3)),
    np.array(7.5),  # 0-d
]


@pytest.mark.parametrize("a", ARRAY_CASES, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_small_arrays_are_sent_inline_and_arrive_read_only_and_exact(pool, a):
    b = _native.small_dumps(a)
    assert b is not None
    for back in (_native.small_loads(b), pool.submit(tasks.ident, a).result(timeout=60)):
        assert type(back) is np.ndarray
        assert back.dtype == a.dtype and back.dtype.str == a.dtype.str and back.shape == a.shape
        assert np.array_equal(back, a)
        assert back.flags.f_contiguous == a.flags.f_contiguous or a.ndim < 2
        assert not back.flags.writeable


def test_arrays_that_are_not_plain_go_through_pickle(pool):
    strided = np.arange(20)[::2]
    objs = np.array([1, "x"], dtype=object)
    rec = np.zeros(2, dtype=[("a", "i4"), ("b", "f8")])
    sub = np.ma.masked_array([1, 2], mask=[0, 1])
    # numpy exports no buffer of datetimes: past the inline limit they are pickled.
    dates = np.arange(10_000).astype("datetime64[s]")
    for a in (strided, objs, rec, sub, dates):
        assert _native.small_dumps(a) is None
        back = pool.submit(tasks.ident, a).result(timeout=60)
        assert type(back) is type(a) and back.dtype == a.dtype
        assert np.array_equal(np.asarray(back), np.asarray(a))
    a = np.arange(3)
    assert _native.small_dumps([a, a]) is None  # shared: pickle keeps the sharing
    x, y = pool.submit(tasks.ident, [a, a]).result(timeout=60)
    assert x is y


BIG_CASES = [
    np.arange(100_000, dtype=np.float64),
    np.asfortranarray(np.arange(6000, dtype=np.int32).reshape(60, 100)),
    np.arange(3000, dtype=">f8").reshape(30, 100),
    np.ones(5000, dtype=np.bool_),
    np.arange(1000, dtype=np.complex128),
    np.array(["abcd"] * 400, dtype="U4"),
    np.zeros((10, 10, 10, 10), dtype=np.uint8),
]


@pytest.mark.parametrize("a", BIG_CASES, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_large_arrays_travel_out_of_band_as_read_only_views(pool, a):
    b = _native.small_dumps(a)
    assert b is not None and b[:1] == b"k"  # values, then the array bytes, no pickle
    for back in (_native.small_loads(b), pool.submit(tasks.ident, a).result(timeout=60)):
        assert type(back) is np.ndarray
        assert back.dtype.str == a.dtype.str and back.shape == a.shape
        assert np.array_equal(back, a)
        assert back.flags.f_contiguous == a.flags.f_contiguous
        assert type(back.base).__name__ == "ShmBuffer"  # a view of the payload's memory
        assert not back.flags.writeable
        with pytest.raises(ValueError):
            back.flags.writeable = True
        copy = back.copy()
        copy.flat[0] = copy.flat[1]  # a copy is the caller's to change


def test_out_of_band_arrays_mix_with_small_values_and_keep_their_memory(pool):
    a = np.arange(10_000, dtype=np.float64)
    b = np.arange(7_000, dtype=np.int16).reshape(70, 100)
    value = {"a": a, "pair": (b, 3), "xs": [1.5, "s", np.arange(3)]}
    got = pool.submit(tasks.ident, value).result(timeout=60)
    assert np.array_equal(got["a"], a) and np.array_equal(got["pair"][0], b)
    assert got["pair"][1] == 3 and got["xs"][:2] == [1.5, "s"]
    # Keyword arguments and several arrays in one call.
    assert pool.submit(tasks.add, a, b=a).result(timeout=60).sum() == 2 * a.sum()
    # A view outlives everything else that referred to its payload.
    keep = got["pair"][0]
    del got
    import gc

    gc.collect()
    assert np.array_equal(keep, b)


def test_malformed_out_of_band_arrays_raise_value_error():
    a = np.arange(1024, dtype=np.int64)
    good = _native.small_dumps(a)
    assert np.array_equal(_native.small_loads(good), a)
    # `k`: header, one 24-byte entry (position, length, code), the values, the array's bytes.
    assert good[:1] == b"k" and int.from_bytes(good[4:8], "little") == 1
    m = int.from_bytes(good[8:16], "little")
    body = good[40 : 40 + m]
    at = int.from_bytes(good[16:24], "little")

    def with_entry(pos=at, length=8192, code=0):
        entry = pos.to_bytes(8, "little") + length.to_bytes(8, "little") + bytes([code]) + bytes(7)
        return good[:16] + entry + good[40:]

    item = 40 + body.index(b"\x13")  # the out-of-band array item
    bad = [
        good[:100],  # the array bytes cut short
        good[:8] + (10_000).to_bytes(8, "little") + good[16:],  # body longer than the payload
        b"K" + body,  # an out-of-band array in a payload without buffers
        with_entry(pos=at + 8, length=8184),  # misaligned
        with_entry(length=8192 + 64),  # past the end
        with_entry(length=8191),  # bytes do not fit the shape
        with_entry(length=2**63),  # absurd length
        with_entry(code=2),  # a buffer of another kind (an R double vector's)
        with_entry(code=0x40),  # writable but not shared
        good[:item] + b"\x12" + good[item + 1 :],  # inline tag over out-of-band fields
        good[:8] + bytes(8) + good[16:],  # empty body
    ]
    for b in bad:
        with pytest.raises(ValueError):
            _native.small_loads(b)
    rng = random.Random(11)
    decoded = refused = 0
    for _ in range(500):
        b = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(1, 8 + m)] = rng.randrange(256)  # header and body
        try:
            _native.small_loads(bytes(b))
            decoded += 1
        except ValueError:
            refused += 1
    assert refused > 0 and decoded + refused == 500


def test_malformed_inline_arrays_raise_value_error():
    good = _native.small_dumps(np.arange(4, dtype=np.int32))
    assert np.array_equal(_native.small_loads(good), np.arange(4, dtype=np.int32))
    dt = b"<i4"
    head = b"K\x12C" + bytes([len(dt)]) + dt + b"\x01" + (4).to_bytes(8, "little")
    assert good.startswith(head)
    bad = [
        head + (15).to_bytes(4, "little") + bytes(15),  # bytes do not fit the dtype
        head + (12).to_bytes(4, "little") + bytes(12),  # nor the shape
        b"K\x12X" + good[3:],  # unknown order
        b"K\x12C\x03|O8\x01" + (1).to_bytes(8, "little") + (8).to_bytes(4, "little") + bytes(8),  # objects
        b"K\x12C\x04zzzz\x01" + (1).to_bytes(8, "little") + (8).to_bytes(4, "little") + bytes(8),  # no dtype
        good[:-3],  # truncated
    ]
    for b in bad:
        with pytest.raises(ValueError):
            _native.small_loads(b)


def test_a_task_in_a_cycle_with_its_kept_exception_is_collected(pool):
    import gc
    import weakref

    def hold():
        t = pool.submit(tasks.boom, "cycle")
        try:
            t.result(timeout=60)
        except ValueError as e:
            return weakref.ref(t), e  # e.__traceback__ -> this frame -> t -> e

    ref, e = hold()
    del e
    gc.collect()
    assert ref() is None


def test_keyword_arguments_that_are_not_small_reach_the_function(pool):
    # A set is not a small value: the call is pickled as [args, kwargs] (once mistaken for
    # positional arguments when both were a tuple).
    got = pool.submit(tasks.kw_pair, (1, 2), b=frozenset({3})).result(timeout=60)
    assert got == ((1, 2), frozenset({3}))
    a = np.arange(3)
    x, y = pool.submit(tasks.kw_pair, a, b=a).result(timeout=60)  # shared: pickled
    assert x is y and np.array_equal(x, a)
