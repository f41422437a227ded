"""Lambdas and local functions travel by value; their pickle is kept between calls only while
everything it holds is unchanged, so a worker always runs what the caller would run now."""

import pytest

import pymizu
from pymizu import _codec

SCALE = 2
TABLE = [1, 2, 3]


@pytest.fixture(scope="module")
def ex():
    with pymizu.PoolExecutor(2) as e:
        yield e


def test_a_lambda_is_pickled_once_while_what_it_reads_is_unchanged(ex):
    f = lambda x: x * SCALE  # noqa: E731
    first = _codec.fn_ref(f)
    assert first is not None and _codec.fn_ref(f) is first
    assert [ex.submit(f, i).result() for i in range(3)] == [0, 2, 4]


def test_a_rebound_global_is_seen_at_the_next_call(ex):
    global SCALE
    f = lambda x: x * SCALE  # noqa: E731
    try:
        assert ex.submit(f, 5).result() == 10
        SCALE = 3
        assert ex.submit(f, 5).result() == 15
        SCALE = "ab"
        assert ex.submit(f, 2).result() == "abab"
    finally:
        SCALE = 2


def test_a_global_that_changes_in_place_is_pickled_with_each_call(ex):
    f = lambda: sum(TABLE)  # noqa: E731
    assert _codec.fn_ref(f) is None
    try:
        assert ex.submit(f).result() == 6
        TABLE.append(10)
        assert ex.submit(f).result() == 16
    finally:
        del TABLE[3:]


def test_a_closure_is_kept_while_its_cells_hold_the_same_objects(ex):
    def make(k):
        def mul(x):
            return x * k

        def rebind(v):
            nonlocal k
            k = v

        return mul, rebind

    mul, rebind = make(4)
    assert _codec.fn_ref(mul) is _codec.fn_ref(mul)
    assert ex.submit(mul, 2).result() == 8
    rebind(7)
    assert ex.submit(mul, 2).result() == 14
    # A cell holding a list: pickled with each call.
    acc = [1]
    g = lambda: len(acc)  # noqa: E731
    assert _codec.fn_ref(g) is None
    acc.append(2)
    assert ex.submit(g).result() == 2


def test_a_new_default_or_code_is_seen(ex):
    def f(x, y=1):
        return x + y

    assert ex.submit(f, 1).result() == 2
    f.__defaults__ = (10,)
    assert ex.submit(f, 1).result() == 11
    f.__code__ = (lambda x, y=1: x * y).__code__
    assert ex.submit(f, 3).result() == 30


def test_a_function_it_calls_that_travels_by_value_is_watched_too(ex):
    # `call` reads the global `HELPER`, a lambda (by value too), rebound below.
    global HELPER
    HELPER = lambda x: x + 1  # noqa: E731
    call = lambda x: HELPER(x)  # noqa: E731
    try:
        assert ex.submit(call, 1).result() == 2
        HELPER = lambda x: x + 100  # noqa: E731
        assert ex.submit(call, 1).result() == 101
        # The lambda HELPER holds is watched as well: its code replaced in place.
        HELPER.__code__ = (lambda x: x - 1).__code__
        assert ex.submit(call, 1).result() == 0
    finally:
        del HELPER


def test_what_keeps_state_identity_cannot_watch_is_pickled_with_each_call(ex):
    def kw(x, *, y=2):
        return x * y

    def tagged(x):
        return x

    tagged.note = "attribute"
    assert _codec.fn_ref(kw) is None and _codec.fn_ref(tagged) is None
    assert ex.submit(kw, 3).result() == 6 and ex.submit(tagged, 4).result() == 4


def test_functions_made_anew_for_each_call_run_with_their_own_defaults_and_closures(ex):
    # One code, a new function per call (`submit(lambda: ...)` in a loop): each call runs
    # with what its own function holds at submission — values of any kind, changed in place
    # or not — and with the globals as they are then.
    global SCALE
    rows = [[i] for i in range(3)]
    futs = []
    for i in range(40):
        futs.append(ex.submit(lambda i=i: i * SCALE))
        futs.append(ex.submit(lambda: (i, SCALE)))
        row = rows[i % 3]
        futs.append(ex.submit(lambda: sum(row)))
        if i == 20:
            SCALE = 5
        rows[i % 3].append(1)
    try:
        got = [f.result(timeout=60) for f in futs]
    finally:
        SCALE = 2
    want = []
    seen = [[i] for i in range(3)]
    for i in range(40):
        s = 2 if i <= 20 else 5
        want += [i * s, (i, s), sum(seen[i % 3])]
        seen[i % 3].append(1)
    assert got == want


def test_a_function_made_anew_fails_and_recurses_as_it_would_here(ex):
    def make(n):
        def fact(k):
            return 1 if k <= 1 else k * fact(k - 1)

        return lambda: fact(n)

    assert [ex.submit(make(n)).result(timeout=60) for n in range(1, 7)] == [1, 2, 6, 24, 120, 720]
    for d in (1, 2):
        with pytest.raises(ZeroDivisionError):
            ex.submit(lambda d=d: 1 // (d - d)).result(timeout=60)

    def late():
        def use():
            return later()

        f = ex.submit(use)  # `later` is not bound yet: its cell is empty
        later = lambda: 1  # noqa: E731
        return f, later

    f, _ = late()
    with pytest.raises(NameError):
        f.result(timeout=60)


def test_functions_made_anew_read_the_globals_as_they_were_at_each_call(ex):
    # A loop variable at a script's (or a notebook's) top level is a global: each call sees
    # its value then, also when it changes kind or goes away.
    global STEP
    futs = []
    kept = lambda: STEP * 3  # noqa: E731
    try:
        for STEP in range(30):
            futs.append(ex.submit(lambda: (STEP, SCALE)))
        # One function, called again and again while the global it reads changes.
        got = []
        for STEP in range(30):
            got.append(ex.submit(kept).result(timeout=60))
        assert got == [3 * i for i in range(30)]
        STEP = [1, 2]
        futs.append(ex.submit(lambda: (STEP, SCALE)))
        STEP = "s"
        futs.append(ex.submit(lambda: (STEP, SCALE)))
        del STEP
        futs.append(ex.submit(lambda: (STEP, SCALE)))  # noqa: F821
        assert [f.result(timeout=60) for f in futs[:-1]] == [(i, 2) for i in range(30)] + [([1, 2], 2), ("s", 2)]
        with pytest.raises(NameError):
            futs[-1].result(timeout=60)
    finally:
        globals().pop("STEP", None)


COUNT = 0


def test_a_function_made_anew_that_assigns_a_global_runs_as_a_whole_function_would(ex):
    def make():
        def bump():
            global COUNT
            COUNT = 10
            return COUNT

        return bump

    assert [ex.submit(make()).result(timeout=60) for _ in range(5)] == [10] * 5
    assert COUNT == 0


def test_a_function_pickle_cannot_name_travels_by_value_and_is_kept(ex):
    # Made by `exec`: in a namespace of its own (its module, `__notebook__`, cannot be
    # imported) or with no `__name__` at all (its module is None, as for code generators'
    # functions). Pickling such a function by name fails after searching for its module.
    ns = {"__name__": "__notebook__", "TABLE": TABLE}
    exec("def twice(x):\n    return 2 * x\ndef plus_table(x):\n    return x + sum(TABLE)\n", ns)
    bare = {}
    exec("def square(x):\n    return x * x\n", bare)
    twice, plus_table, square = ns["twice"], ns["plus_table"], bare["square"]
    assert twice.__module__ == "__notebook__" and square.__module__ is None
    for f in (twice, square):
        first = _codec.fn_ref(f)
        assert first is not None and _codec.fn_ref(f) is first
    assert [ex.submit(twice, i).result() for i in range(3)] == [0, 2, 4]
    assert list(ex.map(square, range(4))) == [0, 1, 4, 9]
    with pymizu.Pool(1) as p:
        assert [t.result() for t in p.submit_batch(square, [(i,) for i in range(3)])] == [0, 1, 4]
        assert p.submit(twice, 21).result() == 42
        # Holding a list: pickled with each call, so the worker sees it as it is now.
        assert _codec.fn_ref(plus_table) is None
        try:
            assert p.submit(plus_table, 1).result() == 7
            TABLE.append(10)
            assert p.submit(plus_table, 1).result() == 17
        finally:
            del TABLE[3:]


def test_a_map_sends_a_kept_function_once_not_with_each_chunk(ex, monkeypatch):
    # The chunks of a map of a lambda carry its kept pickle; nothing is pickled by value
    # (cloudpickle) chunk by chunk, and the elements are pickled as plain data.
    f = lambda x, k=3: x * k + SCALE  # noqa: E731
    assert _codec.fn_ref(f) is not None
    import cloudpickle

    by_value = []
    real = cloudpickle.dumps
    monkeypatch.setattr(cloudpickle, "dumps", lambda obj, *a, **k: by_value.append(obj) or real(obj, *a, **k))
    want = [x * 3 + SCALE for x in range(2000)]
    with pymizu.Pool(2) as pool:
        assert pool.map(f, range(2000)) == want
        assert sorted(pool.imap_unordered(f, range(2000))) == sorted(want)
        assert pool.map(f, range(2000), seed=7) == want
        assert pool.starmap(f, [(x, 2) for x in range(500)]) == [x * 2 + SCALE for x in range(500)]
    assert list(ex.map(f, range(2000))) == want
    assert by_value == [], f"{len(by_value)} chunk(s) pickled by value"


def test_a_map_of_a_function_that_reads_mutable_state_sees_it_as_at_the_map(ex):
    f = lambda x: x + sum(TABLE)  # noqa: E731
    assert _codec.fn_ref(f) is None
    try:
        assert list(ex.map(f, range(300))) == [x + 6 for x in range(300)]
        TABLE.append(10)
        with pymizu.Pool(2) as pool:
            assert pool.map(f, range(300)) == [x + 16 for x in range(300)]
    finally:
        del TABLE[3:]
