"""Python pools of R workers (`Pool(language="r")`) and Python workers running cross-language
calls: real Rscript workers of the installed mizu R package (`cargo xtask test` installs it
and points R_LIBS at it)."""

import os
import signal
import time

import numpy as np
import pyarrow as pa
import pytest

import pymizu


@pytest.fixture(scope="module")
def rpool():
    with pymizu.Pool(2, language="r") as p:
        yield p


def test_the_examples(rpool):
    q = rpool.submit(pymizu.call("stats::quantile", np.arange(101.0), probs=np.array([0.25, 0.5, 0.75]), names=False))
    assert q.result().tolist() == [25.0, 50.0, 75.0]
    assert rpool.submit(pymizu.call(source="y <- x * 2\ny + 1", x=20)).result() == 41.0
    assert rpool.map(pymizu.call("stats::median"), [np.arange(5.0), np.arange(7.0)]) == [2.0, 3.0]


def test_a_data_frame_there_and_back(rpool):
    import pandas as pd

    df = pd.DataFrame({"a": np.arange(100_000.0)})
    t = rpool.submit(pymizu.call("transform", df, b=1)).result()
    tab = pa.table(t)
    assert tab.column_names == ["a", "b"]
    assert tab.num_rows == 100_000
    assert tab.column("a").to_numpy().tolist() == df["a"].tolist()
    assert set(tab.column("b").to_pylist()) == {1}
    back = pd.DataFrame(tab.to_pydict())
    assert back["a"].sum() == df["a"].sum()


def test_scalars_lists_and_dicts_both_ways(rpool):
    ident = pymizu.call("identity")
    for v in [None, True, False, 7, -3, 2.5, 1 + 2j, "héllo", b"\x00\x01\xff"]:
        assert rpool.submit(ident, v).result() == v
    assert rpool.submit(ident, [1, "a", None]).result() == [1, "a", None]
    assert rpool.submit(ident, {"x": 1.5, "y": [True]}).result() == {"x": 1.5, "y": [True]}
    # A Python int past R's integer range becomes a double (exact below 2**53).
    assert rpool.submit(ident, 2**40).result() == float(2**40)
    # An R named vector is a dict.
    assert rpool.submit(pymizu.call(source="c(a = 1, b = 2)")).result() == {"a": 1.0, "b": 2.0}


def test_arrays_keep_types_and_dims(rpool):
    ident = pymizu.call("identity")
    for a in [
        np.arange(10, dtype=np.float64),
        np.arange(10, dtype=np.int32),
        np.arange(10, dtype=np.int64) * 2**40,
        np.array([True, False, True]),
        np.arange(7, dtype=np.uint8),
        np.array(["2024-01-02", "1969-12-31"], dtype="datetime64[D]"),
        np.array([1_000_000, -5], dtype="timedelta64[us]"),
    ]:
        got = rpool.submit(ident, a).result()
        assert isinstance(got, (np.ndarray, bytes)), type(got)
        if isinstance(got, bytes):  # raw
            assert got == a.tobytes()
        else:
            assert got.tolist() == a.tolist(), a.dtype
    # Smaller integer types widen to R integers; float32 to doubles.
    assert rpool.submit(ident, np.arange(4, dtype=np.int16)).result().dtype == np.int32
    assert rpool.submit(ident, np.arange(4, dtype=np.float32)).result().dtype == np.float64
    m = np.arange(6.0).reshape(2, 3)
    got = rpool.submit(pymizu.call("dim"), m).result()
    assert got.tolist() == [2, 3]
    assert rpool.submit(ident, m).result().tolist() == m.tolist()
    assert rpool.submit(pymizu.call(source="x[2, 3]", x=m)).result() == 5.0
    # Strings and NA.
    assert rpool.submit(ident, np.array(["a", "b"])).result().tolist() == ["a", "b"]
    with_na = rpool.submit(pymizu.call(source='c("a", NA, "c")')).result()
    assert pa.array(with_na).to_pylist() == ["a", None, "c"]
    assert pa.array(rpool.submit(pymizu.call(source="c(1L, NA)")).result()).to_pylist() == [1, None]
    f = pa.array(rpool.submit(pymizu.call(source='factor(c("x", "y", "x"))')).result())
    assert f.type == pa.dictionary(pa.int32(), pa.string()) and f.to_pylist() == ["x", "y", "x"]
    nan = rpool.submit(pymizu.call(source="c(1, NA, 3)")).result()
    assert np.isnan(nan[1]) and nan[0] == 1.0


def test_received_arrays_are_read_only_views(rpool):
    a = rpool.submit(pymizu.call(source="seq_len(100000) + 0.5")).result()
    assert isinstance(a, np.ndarray) and not a.flags.writeable
    assert a[0] == 1.5 and a[-1] == 100000.5


def test_r_errors_carry_classes_message_and_call(rpool):
    with pytest.raises(pymizu.RError) as ei:
        rpool.submit(pymizu.call("stop", "boom")).result()
    assert ei.value.message == "boom"
    assert "simpleError" in ei.value.classes and "error" in ei.value.classes
    assert isinstance(ei.value, pymizu.TaskError)
    with pytest.raises(pymizu.RError) as ei:
        rpool.submit(pymizu.call(source='f <- function(x) stop("bad x"); f(1)')).result()
    assert ei.value.call == "f(1)"
    with pytest.raises(pymizu.RError, match="could not find function"):
        rpool.submit(pymizu.call("no_such_function_here", 1)).result()
    # The pool goes on.
    assert rpool.submit(pymizu.call("sum", np.arange(4.0))).result() == 6.0


def test_values_that_cannot_cross_fail_at_submit_naming_where(rpool):
    with pytest.raises(TypeError, match=r"args\[0\]\['a'\]\[1\]: a set cannot cross"):
        rpool.submit(pymizu.call("identity", {"a": [1, {2}]}))
    with pytest.raises(TypeError, match="object-dtype"):
        rpool.submit(pymizu.call("identity", np.array([object()])))
    # An R value without a counterpart fails the task with a clear error.
    with pytest.raises(pymizu.RError, match="an environment cannot cross"):
        rpool.submit(pymizu.call(source="new.env()")).result()
    with pytest.raises(TypeError, match="pymizu.call"):
        rpool.submit(len, [1])


def test_strings_r_cannot_hold_fail_the_task_clearly(rpool):
    # R strings cannot hold a NUL byte: the task fails saying so (R's own error, raised
    # through the binding's Rust, used to escape it), and the worker goes on.
    for bad in (pymizu.call("identity", "a\x00b"), pymizu.call("identity", {"k\x00": 1}),
                pymizu.call("paste0", **{"x\x00": "y"}), pymizu.call("ident\x00ity", 1)):
        with pytest.raises(pymizu.RError, match="NUL byte"):
            rpool.submit(bad).result()
    # An empty argument name is R's "no name".
    assert rpool.submit(pymizu.call("paste0", "a", **{"": "b"})).result() == "ab"
    assert rpool.submit(pymizu.call("identity", "fine")).result() == "fine"


def test_seeded_maps_draw_the_same_numbers_in_both_languages(rpool):
    seed = 20261201
    r = rpool.map(pymizu.call("runif"), [3, 3, 3, 3], seed=seed)
    with pymizu.Pool(2) as py:
        p = py.map(_draw, range(4), seed=seed)
    for i in range(4):
        assert np.asarray(r[i]).tolist() == p[i]
        ref = np.random.Generator(np.random.Philox(key=seed, counter=i << 128)).random(3)
        assert p[i] == ref.tolist()


def _draw(_):
    return pymizu.current_rng().random(3).tolist()


def test_maps_travel_in_chunks_and_give_the_same_values_for_any_chunk_size(rpool):
    xs = [float(i) for i in range(1000)]
    want = [x**0.5 for x in xs]
    for size in (None, 1, 7, 1000):
        assert rpool.map(pymizu.call("sqrt"), xs, chunksize=size) == want
    # Fixed arguments come first, then the element; keywords stay keywords.
    got = rpool.map(pymizu.call("paste", "a", sep="-"), ["x", "y", "z"], chunksize=2)
    assert got == ["a-x", "a-y", "a-z"]
    # Several iterables spread into the arguments (starmap too).
    assert rpool.map(pymizu.call("sum"), [1, 2, 3], [10, 20, 30], chunksize=2) == [11, 22, 33]
    assert rpool.starmap(pymizu.call("paste0"), [("a", 1), ("b", 2)]) == ["a1", "b2"]
    # NULL results stay in place, and an empty map is empty.
    assert rpool.map(pymizu.call("identity"), [None, 1, None], chunksize=3) == [None, 1, None]
    assert rpool.map(pymizu.call("sqrt"), []) == []
    assert list(rpool.imap(pymizu.call("sqrt"), [4.0, 9.0], chunksize=1)) == [2.0, 3.0]
    with pytest.raises(ValueError, match="chunksize"):
        rpool.map(pymizu.call("sqrt"), [1.0], chunksize=0)
    with pytest.raises(TypeError, match="names a function"):
        rpool.map(pymizu.call(source="x"), [1.0])


def test_seeded_chunked_maps_draw_what_unchunked_ones_do(rpool):
    seed = 77
    one = rpool.map(pymizu.call("runif"), [2] * 25, seed=seed, chunksize=1)
    for size in (None, 4, 25):
        got = rpool.map(pymizu.call("runif"), [2] * 25, seed=seed, chunksize=size)
        assert [np.asarray(g).tolist() for g in got] == [np.asarray(o).tolist() for o in one]
    ref = np.random.Generator(np.random.Philox(key=seed, counter=(5 + 19) << 128)).random(2)
    last = rpool.map(pymizu.call("runif"), [2] * 20, seed=seed, offset=5, chunksize=6)[-1]
    assert np.asarray(last).tolist() == ref.tolist()


def test_a_failing_element_of_a_chunk_names_its_position(rpool):
    xs = ["2024-01-01", "2024-01-02", "x", "2024-01-04", "y"]
    for size in (1, 2, 5):
        with pytest.raises(pymizu.RError) as ei:
            rpool.map(pymizu.call("as.Date"), xs, chunksize=size, offset=3)
        assert ei.value._pymizu_index == 2, size
        assert "unambiguous format" in ei.value.message
    # A result that cannot cross names the element (its index in the map).
    with pytest.raises(pymizu.RError, match=r"element 4: a function cannot cross") as ei:
        rpool.map(pymizu.call("get"), ["pi", "pi", "emptyenv"], chunksize=2, offset=2)
    assert ei.value._pymizu_index == 2
    # Warnings of every element reach the caller.
    with pytest.warns(UserWarning, match="NAs introduced by coercion"):
        got = rpool.map(pymizu.call("as.numeric"), ["1", "a"], chunksize=2)
    assert got[0] == 1.0 and np.isnan(got[1])
    assert rpool.map(pymizu.call("sqrt"), [16.0]) == [4.0]


def test_a_killed_r_worker_fails_only_its_task():
    with pymizu.Pool(1, language="r") as p:
        t = p.submit(pymizu.call(source="Sys.sleep(30)"))
        deadline = time.monotonic() + 30
        while not any(w["busy"] for w in p.status()["workers"]):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pid = p.status()["workers"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(pymizu.WorkerDiedError):
            t.result(timeout=30)
        assert p.submit(pymizu.call("sum", 1, 2)).result(timeout=60) == 3


def test_a_killed_r_worker_fails_only_its_chunk_of_a_map():
    with pymizu.Pool(1, language="r") as p:
        it = p.imap(pymizu.call("Sys.sleep"), [0, 30, 0, 0], chunksize=2)
        deadline = time.monotonic() + 30
        while not any(w["busy"] for w in p.status()["workers"]):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(p.status()["workers"][0]["pid"], signal.SIGKILL)
        with pytest.raises(pymizu.WorkerDiedError):
            list(it)
        assert p.map(pymizu.call("sqrt"), [4.0, 9.0, 16.0], chunksize=2) == [2.0, 3.0, 4.0]


def test_exec_timeout_and_cancel():
    with pymizu.Pool(1, language="r", exec_timeout=0.5) as p:
        slow = p.submit(pymizu.call(source="Sys.sleep(20)"))
        queued = p.submit(pymizu.call("sum", 1))
        assert queued.cancel() or queued.result(timeout=30) == 1
        with pytest.raises(pymizu.ExecTimeoutError):
            slow.result(timeout=30)
        assert p.submit(pymizu.call("sum", 2)).result(timeout=60) == 2


def test_await_an_r_task(rpool):
    import asyncio

    async def main():
        return await rpool.submit(pymizu.call("sum", 1, 2, 3))

    assert asyncio.run(main()) == 6


def test_python_workers_run_cross_language_calls():
    # What an R pool sends to Python workers, sent from Python to check the worker side.
    with pymizu.Pool(1) as p:
        x = p._pool.submit_xcall(pymizu.call("statistics.fmean", np.array([1.0, 2.0, 3.0]))).result()
        assert x == 2.0
        src = pymizu.call(source="import numpy as np\nfloat(np.sum(x))", x=np.ones(5))
        assert p._pool.submit_xcall(src).result() == 5.0
        with pytest.raises(pymizu.PythonTaskError) as ei:
            p._pool.submit_xcall(pymizu.call("fractions.Fraction", 1, 0)).result()
        assert ei.value.classes[:2] == ["ZeroDivisionError", "ArithmeticError"]
        assert "Traceback" in ei.value.traceback and "fractions.py" in ei.value.traceback


def test_missing_r_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MIZU_RSCRIPT", "/nonexistent/Rscript")
    with pytest.raises(pymizu.MizuError, match="R workers need a working R"):
        pymizu.Pool(1, language="r")
    with pytest.raises(ValueError, match="language"):
        pymizu.Pool(1, language="julia")


def test_nothing_left_in_dev_shm():
    def mine():
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"mizu_{os.getpid():x}_")}

    before = mine()
    with pymizu.Pool(1, language="r") as p:
        p.submit(pymizu.call("identity", np.arange(100_000.0))).result()
    deadline = time.monotonic() + 10
    while mine() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert mine() - before == set()


R_ECHO = """
repeat {
  x <- mizu_recv(channel)
  if (mizu_is_sentinel(x)) break
  mizu_send(channel, list(twice = x$v * 2, n = length(x$v), tag = x$tag))
}
"""


def test_a_channel_to_an_r_peer():
    with pymizu.Channel.spawn(R_ECHO, language="r", timeout=60) as ch:
        assert ch.send({"v": np.arange(5.0), "tag": "a"}) is True
        got = ch.recv(timeout=60)
        assert got["twice"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
        assert got["n"] == 5 and got["tag"] == "a"
        assert ch.send_batch([{"v": np.ones(3), "tag": str(i)} for i in range(3)]) == 3
        assert [ch.recv(timeout=60)["tag"] for _ in range(3)] == ["0", "1", "2"]
        with pytest.raises(TypeError, match=r"message 0: \['v'\]: a set cannot cross"):
            ch.send({"v": {1}})


def test_a_killed_r_peer_is_peer_gone():
    with pymizu.Channel.spawn("mizu_send(channel, Sys.getpid())\nSys.sleep(60)", language="r", timeout=60) as ch:
        pid = ch.recv(timeout=60)
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGKILL)
        assert ch.recv(timeout=60) is pymizu.PEER_GONE


def _random_frame(g, n):
    import pandas as pd

    cols = {}
    for j in range(int(g.integers(1, 7))):
        kind = int(g.integers(0, 7))
        name = f"c{j}"
        if kind == 0:
            v = g.normal(size=n)
            v[g.random(n) < 0.1] = np.nan
            cols[name] = v
        elif kind == 1:
            cols[name] = g.integers(-(2**31) + 1, 2**31 - 1, n, dtype=np.int32)
        elif kind == 2:
            cols[name] = g.random(n) < 0.5
        elif kind == 3:
            words = np.array(["a", "bé", "", "水", "longer words"])
            cols[name] = pd.Series(words[g.integers(0, len(words), n)], dtype="str")
        elif kind == 4:
            cols[name] = pd.Categorical(np.array(["x", "y", "z"])[g.integers(0, 3, n)], categories=["z", "y", "x"])
        elif kind == 5:
            cols[name] = np.datetime64("1960-01-01") + g.integers(-5000, 40000, n).astype("timedelta64[D]")
        else:
            cols[name] = g.integers(-(2**62), 2**62, n, dtype=np.int64)
    return pd.DataFrame(cols)


def test_random_frames_python_to_r_and_back(rpool):
    g = np.random.default_rng(2026)
    ident = pymizu.call("identity")
    for _ in range(40):
        n = int(g.choice([0, 1, 2, 17, 1000, 5000]))
        df = _random_frame(g, n)
        sent = pa.Table.from_pandas(df, preserve_index=False)
        back = pa.table(rpool.submit(ident, df).result())
        assert back.num_rows == n and back.column_names == sent.column_names
        for name in sent.column_names:
            a, b = sent.column(name), back.column(name)
            if pa.types.is_dictionary(a.type):
                assert b.to_pylist() == a.to_pylist()
                assert b.combine_chunks().dictionary.to_pylist() == a.combine_chunks().dictionary.to_pylist()
            elif pa.types.is_timestamp(a.type) or pa.types.is_date(a.type):
                assert b.cast(pa.int64()).to_pylist() == a.cast(pa.timestamp("us")).cast(pa.int64()).to_pylist() or (
                    b.to_pylist() == a.to_pylist()
                )
            elif pa.types.is_floating(a.type):
                x, y = a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False)
                assert np.array_equal(x, y, equal_nan=True)
            else:
                assert b.to_pylist() == a.to_pylist(), name


def test_more_rows_of_the_mapping(rpool):
    import pandas as pd

    ident = pymizu.call("identity")
    # uint32 and uint64 become doubles; float32 widens exactly.
    got = rpool.submit(pymizu.call(source="typeof(x)", x=np.array([1, 2], dtype=np.uint32))).result()
    assert got == "double"
    assert rpool.submit(ident, np.array([2**40, 7], dtype=np.uint64)).result().tolist() == [2.0**40, 7.0]
    # NaN payloads survive both ways (R's NA_real_ is one).
    na_bits = rpool.submit(pymizu.call(source="NA_real_")).result()
    assert np.float64(na_bits).view(np.uint64) == 0x7FF00000000007A2
    weird = np.array([0x7FF8DEADBEEF0001, 0], dtype=np.uint64).view(np.float64)
    assert rpool.submit(ident, weird).result().view(np.uint64)[0] == 0x7FF8DEADBEEF0001
    assert np.float64(rpool.submit(ident, float(weird[0])).result()).view(np.uint64) == 0x7FF8DEADBEEF0001
    # int64 NA is R's integer64 NA, and back.
    a = np.array([5, np.iinfo(np.int64).min, -7], dtype=np.int64)
    assert rpool.submit(pymizu.call(source="class(x)", x=a)).result() == "integer64"
    back = pa.array(rpool.submit(ident, a).result())
    assert back.to_pylist() == [5, None, -7]
    # Time zones, ordered factors and difftime units come back as they were.
    ts = pa.array([0, 1_700_000_000_000_000], type=pa.timestamp("us", tz="America/New_York"))
    got = pa.array(rpool.submit(ident, ts).result())
    assert got.type == pa.timestamp("us", tz="America/New_York") and got.to_pylist() == ts.to_pylist()
    assert rpool.submit(pymizu.call(source='attr(x, "tzone")', x=ts)).result() == "America/New_York"
    o = rpool.submit(pymizu.call(source='factor(c("lo", "hi", "lo"), levels = c("lo", "hi"), ordered = TRUE)')).result()
    assert pa.array(o).to_pylist() == ["lo", "hi", "lo"]
    assert rpool.submit(pymizu.call(source="class(x)", x=o)).result().tolist() == ["ordered", "factor"]
    # ... and both ways as Arrow's ordered dictionaries (pandas' ordered categoricals).
    assert pa.array(o).type.ordered
    oc = pd.DataFrame({"f": pd.Categorical(["lo", "hi", "lo"], categories=["lo", "hi"], ordered=True)})
    assert rpool.submit(pymizu.call(source="class(x$f)", x=oc)).result().tolist() == ["ordered", "factor"]
    assert pa.table(rpool.submit(ident, oc).result()).to_pandas()["f"].cat.ordered
    # A frame of no rows keeps its categories (its Arrow stream has no batch to carry them).
    empty = pd.DataFrame({"f": pd.Categorical([], categories=["a", "b"])})
    assert rpool.submit(pymizu.call(source="levels(x$f)", x=empty)).result().tolist() == ["a", "b"]
    d = rpool.submit(pymizu.call(source='as.difftime(c(1.5, 3), units = "hours")')).result()
    assert d.dtype == np.dtype("m8[us]") and d.tolist()[0].total_seconds() == 5400.0
    # An n-dimensional array keeps every element at its index.
    cube = np.arange(24.0).reshape(2, 3, 4)
    assert rpool.submit(pymizu.call(source="x[2, 3, 4]", x=cube)).result() == cube[1, 2, 3]
    assert rpool.submit(ident, cube).result().tolist() == cube.tolist()
    # Data frames from polars and pyarrow too.
    import polars as pl

    pf = pl.DataFrame({"a": [1, 2, 3], "s": ["x", None, "z"]})
    t = pa.table(rpool.submit(ident, pf).result())
    assert t.column("s").to_pylist() == ["x", None, "z"]
    assert t.column("a").to_pylist() == [1, 2, 3]


def test_dates_and_times_with_nat_come_back_as_numpy_with_nat(rpool):
    ident = pymizu.call("identity")
    d = np.array(["2020-01-01", "NaT", "2021-05-03"], dtype="datetime64[D]")
    assert rpool.submit(pymizu.call(source="c(class(x), is.na(x))", x=d)).result().tolist() == [
        "Date", "FALSE", "TRUE", "FALSE"]
    back = rpool.submit(ident, d).result()
    assert back.dtype == d.dtype
    np.testing.assert_array_equal(back, d)  # NaT equal to NaT here
    ts = np.array(["2020-01-01T00:00:01.5", "NaT"], dtype="datetime64[us]")
    back = rpool.submit(ident, ts).result()
    assert back.dtype == ts.dtype
    np.testing.assert_array_equal(back, ts)
    td = np.array([1_500_000, "NaT", -3], dtype="timedelta64[us]")
    back = rpool.submit(ident, td).result()
    assert back.dtype == td.dtype
    np.testing.assert_array_equal(back, td)
    # Made in R: NA in every kind.
    got = rpool.submit(pymizu.call(
        source='list(as.Date(c("2001-02-03", NA)), .POSIXct(c(NA, 0), tz = "UTC"), '
               'as.difftime(c(NA, 2), units = "secs"))')).result()
    assert [str(a.dtype) for a in got] == ["datetime64[D]", "datetime64[us]", "timedelta64[us]"]
    assert [np.isnat(a).tolist() for a in got] == [[False, True], [True, False], [True, False]]
    assert got[0][0] == np.datetime64("2001-02-03") and got[2][1] == np.timedelta64(2_000_000, "us")


def test_date_and_time_columns_with_nulls_there_and_back(rpool):
    import polars as pl

    ident = pymizu.call("identity")
    t = pa.table({
        "d": pa.array([None, 18262, 1], pa.date32()),
        "t": pa.array([0, None, 1_700_000_000_000_000], pa.timestamp("us", tz="UTC")),
        "u": pa.array([None, 5, -5], pa.duration("us")),
    })
    assert rpool.submit(pymizu.call(
        source="unname(vapply(x, function(c) sum(is.na(c)), 1L))", x=t)).result().tolist() == [1, 1, 1]
    back = pa.table(rpool.submit(ident, t).result())
    assert back.select(["d", "t", "u"]).equals(t)
    pf = pl.from_arrow(t)
    assert pl.DataFrame(rpool.submit(ident, pf).result()).equals(pf)


def test_pandas_categoricals_and_indexes_and_polars_series_cross(rpool):
    import pandas as pd
    import polars as pl

    ident = pymizu.call("identity")
    describe = pymizu.call(source="list(class(x), levels(x), as.character(x))")
    c = pd.Categorical(["b", "a", "b", None], categories=["b", "a", "z"])
    cls, levels, values = rpool.submit(describe, x=c).result()
    assert cls == "factor" and levels.tolist() == ["b", "a", "z"]
    assert pa.array(values).to_pylist() == ["b", "a", "b", None]
    back = pd.Series(pa.array(rpool.submit(ident, c).result()).to_pandas())
    assert back.cat.categories.tolist() == ["b", "a", "z"] and back.tolist()[:3] == ["b", "a", "b"]
    o = pd.Categorical(["lo", "hi"], categories=["lo", "hi"], ordered=True)
    assert rpool.submit(pymizu.call(source="class(x)", x=o)).result().tolist() == ["ordered", "factor"]
    # Indexes of every supported dtype, a categorical one as a factor.
    assert rpool.submit(ident, pd.Index([1.5, 2.5])).result().tolist() == [1.5, 2.5]
    assert rpool.submit(ident, pd.Index(["a", "b"])).result().tolist() == ["a", "b"]
    assert rpool.submit(ident, pd.RangeIndex(3)).result().tolist() == [0, 1, 2]
    dates = pd.DatetimeIndex(["2020-01-01", None])
    assert rpool.submit(pymizu.call(source="class(x)", x=dates)).result().tolist() == ["POSIXct", "POSIXt"]
    assert rpool.submit(pymizu.call(source="class(x)", x=pd.CategoricalIndex(["x", "y"]))).result() == "factor"
    # polars Series, a categorical one as a factor.
    assert rpool.submit(ident, pl.Series("p", [1.0, None, 3.0])).result()[[0, 2]].tolist() == [1.0, 3.0]
    ps = pl.Series("p", ["a", "b", "a"], dtype=pl.Categorical)
    assert rpool.submit(pymizu.call(source="c(class(x), levels(x))", x=ps)).result().tolist() == [
        "factor", "a", "b"]


def _segment_of(addr: int) -> str:
    for line in open("/proc/self/maps"):
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[-1]
    return ""


def test_a_frame_relayed_unmodified_comes_back_by_reference(rpool):
    import pandas as pd

    n = 100_000
    df = pd.DataFrame({"a": np.arange(n, dtype=np.float64), "s": pd.Series([f"x{i}" for i in range(n)], dtype="str")})
    ident = pymizu.call("identity")
    t1 = rpool.submit(ident, df).result()
    addr = pa.table(t1).column("a").chunks[0].buffers()[1].address
    # R returned its views of what this process sent: the buffers are in this process's segment.
    assert f"/mizu_{os.getpid():x}_" in _segment_of(addr)
    # Relayed again: the very same bytes come back (a reference each way, no copy).
    t2 = rpool.submit(ident, t1).result()
    assert pa.table(t2).column("a").chunks[0].buffers()[1].address == addr
    assert pa.table(t2).equals(pa.table(t1))
    # A computed result is new data.
    t3 = rpool.submit(pymizu.call("transform", t1, b=1)).result()
    assert pa.table(t3).column("a").chunks[0].buffers()[1].address != addr


def test_a_relayed_view_with_changed_attributes_is_sent_as_changed(rpool):
    import pandas as pd

    n = 50_000
    df = pd.DataFrame(
        {
            "f": pd.Categorical(np.array(["lo", "hi"])[np.arange(n) % 2], categories=["lo", "hi"]),
            "t": pd.Series(pd.date_range("2026-01-01", periods=n, freq="s", tz="Europe/Paris")),
            "x": np.arange(n, dtype=np.float64),
            "s": pd.Series([f"s{i}" for i in range(n)], dtype="str"),
        }
    )
    t1 = rpool.submit(pymizu.call("identity"), df).result()
    addr = pa.table(t1).column("x").chunks[0].buffers()[1].address
    # The columns are R's views of what was sent; what R changes of their attributes (not of
    # their elements) must come back changed, not as the bytes that went.
    changes = {
        "levels(x$f) <- toupper(levels(x$f)); x": lambda t: t.column("f").to_pylist()[:2] == ["LO", "HI"],
        'attr(x$t, "tzone") <- "UTC"; x': lambda t: t.column("t").type.tz == "UTC",
        'class(x$f) <- c("ordered", "factor"); x': lambda t: t.column("f").type.ordered,
        'names(x)[3] <- "y"; x': lambda t: t.column_names == ["f", "t", "y", "s"],
        'x$t <- as.Date(x$t); x': lambda t: pa.types.is_date32(t.column("t").type),
    }
    for code, ok in changes.items():
        got = pa.table(rpool.submit(pymizu.call(source=code, x=t1)).result())
        assert ok(got), (code, got.schema)
        assert got.num_rows == n and got.column("s").to_pylist()[-1] == f"s{n - 1}"
        assert np.array_equal(got.column(2).to_numpy(), np.arange(n, dtype=np.float64))
    # Unchanged, it still travels by reference.
    same = pa.table(rpool.submit(pymizu.call(source="y <- x; y", x=t1)).result())
    assert same.column("x").chunks[0].buffers()[1].address == addr
    assert same.equals(pa.table(t1))


def test_a_nul_in_a_large_string_is_refused_every_time(rpool):
    bad = pa.table({"s": pa.array(["ok", "a\x00b"] * 40_000, type=pa.large_string())})
    for _ in range(2):
        with pytest.raises(Exception, match="NUL"):
            rpool.submit(pymizu.call("nrow"), bad).result()
    good = pa.table({"s": pa.array(["ok", "ab"] * 40_000, type=pa.large_string())})
    for _ in range(2):
        assert rpool.submit(pymizu.call("nrow"), good).result() == 80_000


def test_nested_maps_inside_r_tasks_run_on_the_pools_r_workers():
    with pymizu.Pool(2, language="r") as p:
        pids = {w["pid"] for w in p.status()["workers"]}
        got = p.submit(pymizu.call(
            source="unlist(mizu::mizu_map(mizu::mizu_current_pool(), 1:6, function(i) i * 10L))")).result(timeout=60)
        assert got.tolist() == [10, 20, 30, 40, 50, 60]
        ran = p.submit(pymizu.call(
            source="unlist(mizu::mizu_map(mizu::mizu_current_pool(), 1:6, function(i) Sys.getpid()))")).result(timeout=60)
        assert set(ran.tolist()) <= pids
        # Seeded: the same numbers as the same map submitted from Python.
        inner = p.submit(pymizu.call(
            source="unlist(mizu::mizu_map(mizu::mizu_current_pool(), 1:3, function(i) runif(1), .seed = 5))")).result(timeout=60)
        outer = p.map(pymizu.call("runif"), [1, 1, 1], seed=5)
        assert inner.tolist() == [float(x) for x in outer]


def test_a_shared_numpy_array_reaches_r_workers_by_reference(rpool):
    from pymizu import _native

    where = lambda a: _native.shared_region(a)  # noqa: E731  (segment, region, offset)
    for a in (np.arange(1e6), np.arange(300_000, dtype=np.int32), np.asfortranarray(np.ones((500, 400)))):
        s = pymizu.share(a)
        assert s.dtype == a.dtype and s.shape == a.shape and np.array_equal(s, a)
        back = rpool.submit(pymizu.call("identity"), s).result()
        assert where(back) == where(s), "R viewed the shared copy and sent it back by reference"
        assert np.array_equal(back, a)
    # A dtype R would convert (or holds as bits) is still shared (as its bytes), and reaches R
    # as a copy.
    f32 = pymizu.share(np.arange(10.0, dtype=np.float32))
    assert f32.dtype == np.float32 and pymizu.is_shared(f32)
    assert rpool.submit(pymizu.call("sum"), f32).result() == 45.0
    flags = pymizu.share(np.array([True, False, True]))
    assert flags.dtype == np.bool_ and pymizu.is_shared(flags)
    assert rpool.submit(pymizu.call("sum"), flags).result() == 2


def test_a_received_numpy_view_sent_on_goes_by_reference(rpool):
    ident = pymizu.call("identity")
    addr = lambda a: a.__array_interface__["data"][0]  # noqa: E731
    x = rpool.submit(ident, np.arange(1e6)).result()
    y = rpool.submit(ident, x).result()
    assert addr(y) == addr(x) and np.array_equal(x, y)
    # (Past the 4 KiB a message can travel inline in a task slot: it arrives in shared memory.)
    m = rpool.submit(ident, np.arange(600.0).reshape(2, 300)).result()
    m2 = rpool.submit(ident, m).result()
    assert addr(m2) == addr(m) and m2.shape == (2, 300) and np.array_equal(m, m2)
    d = rpool.submit(ident, np.array(["2024-01-01T00:00:01"] * 1000, dtype="datetime64[us]")).result()
    assert addr(rpool.submit(ident, d).result()) == addr(d)
    # Anything else made of it is a new array, sent by value, with its own values.
    s = x[10:20]
    z = rpool.submit(ident, s).result()
    assert addr(z) != addr(x) and np.array_equal(z, s)
    t = rpool.submit(ident, m.T).result()
    assert t.shape == (300, 2) and np.array_equal(t, m.T)
    assert rpool.submit(ident, x.astype(np.float32)).result().dtype == np.float64


def test_r_warnings_are_warned_again_in_python(rpool):
    with pytest.warns(pymizu.RWarning, match="careful"):
        assert rpool.submit(pymizu.call(source='warning("careful"); 1')).result() == 1.0
    with pytest.warns(pymizu.RWarning) as got:
        assert rpool.submit(pymizu.call(source='warning("a"); warning("b"); 2')).result() == 2.0
    assert [str(w.message) for w in got] == ["a", "b"]
    # The next task starts without them.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rpool.submit(pymizu.call("sum", 1)).result() == 1
