"""The native fast path for small calls and results: what qualifies crosses with its exact
type and value, what does not goes through pickle unchanged, malformed payloads are refused
with ValueError — and a kept outcome is the same object every time it is asked for."""

import enum
import math
import random
import threading

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
    bad = [
        b"",
        b"V",
        b"C",
        b"Vq",  # unknown tag
        b"Vn\x00",  # trailing bytes
        b"Vi\x01",  # truncated int
        b"Vs\xff\xff\xff\xff",  # length beyond the payload
        b"VT\xff\xff\xff\x7f",  # count beyond the payload
        b"VD\x01\x00\x00\x00L\x00\x00\x00\x00n",  # an unhashable key
        b"Vs\x02\x00\x00\x00\xc3\x28",  # not UTF-8
        b"V" + b"T\x01\x00\x00\x00" * 100 + b"n",  # nested too deep
        b"C\x05\x00fn",  # function pickle beyond the payload
        b"C\x02\x00fnin",  # arguments not a tuple
        b"C\x02\x00fnT\x00\x00\x00\x00i\x00\x00\x00\x00\x00\x00\x00\x00",  # kwargs not a dict
    ]
    for b in bad:
        with pytest.raises(ValueError):
            _native.small_loads(b)
    call = b"C" + len(b"fn").to_bytes(2, "little") + b"fn" + _native.small_dumps((1, "x", [2.0]))[1:] + b"n"
    assert _native.small_loads(call) == (b"fn", (1, "x", [2.0]), None)
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
