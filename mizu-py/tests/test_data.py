"""Zero-copy data: numpy arrays of every dtype and layout, pandas, pyarrow and polars cross as
read-only views of shared memory; nothing is left in /dev/shm."""

import os
import time

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import pymizu
import tasks


@pytest.fixture(scope="module")
def pool():
    with pymizu.Pool(2) as p:
        yield p


DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", "datetime64[ns]",
          "timedelta64[us]", "S7", "U5", [("a", "i4"), ("b", "f8")]]


def sample(dtype, shape):
    n = int(np.prod(shape))
    raw = np.random.default_rng(0).integers(0, 100, n)
    return raw.astype(dtype).reshape(shape)


def shm_backed(a: np.ndarray) -> bool:
    """Whether the array's memory chain ends in a pymizu shared-memory buffer."""
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return type(base).__name__ == "ShmBuffer"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,order", [((0,), "C"), ((5,), "C"), ((300, 70), "C"), ((300, 70), "F"), ((4, 5, 6, 7), "C")])
def test_numpy_arrays_round_trip_exactly(pool, dtype, shape, order):
    a = np.asarray(sample(dtype, shape), order=order)
    b = pool.submit(tasks.ident, a).result(timeout=60)
    assert b.dtype == a.dtype and b.shape == a.shape
    assert np.array_equal(a, b)
    if a.nbytes > 0:
        assert b.flags.f_contiguous == a.flags.f_contiguous


def test_large_arrays_are_read_only_views_of_shared_memory_on_both_sides(pool):
    a = np.arange(2_000_000, dtype=np.float64)
    kind, dtype, shape, writeable, total = pool.submit(tasks.describe, a).result(timeout=60)
    assert (kind, dtype, shape) == ("ndarray", "<f8", (2_000_000,))
    assert writeable is False, "the worker sees a read-only view"
    assert total == float(a.sum())
    b = pool.submit(tasks.ident, a).result(timeout=60)
    assert not b.flags.writeable
    assert shm_backed(b)
    with pytest.raises(ValueError):
        b[0] = 1.0
    c = b.copy()
    c[0] = 1.0  # a copy is the caller's own


def test_views_outlive_the_pool():
    with pymizu.Pool(1) as p:
        b = p.submit(tasks.ident, np.arange(1_000_000)).result(timeout=60)
    assert int(b.sum()) == sum(range(1_000_000))


def test_non_contiguous_arrays_travel_as_copies(pool):
    a = np.arange(10_000).reshape(100, 100)[::3, ::2]
    assert np.array_equal(pool.submit(tasks.ident, a).result(timeout=60), a)


def test_pandas_frames_round_trip(pool):
    df = pd.DataFrame({
        "i": np.arange(100_000),
        "f": np.linspace(0, 1, 100_000),
        "s": ["x%d" % (i % 17) for i in range(100_000)],
        "c": pd.Categorical(["a", "b", "c", "d"] * 25_000),
        "t": pd.date_range("2026-01-01", periods=100_000, freq="s", tz="UTC"),
    })
    out = pool.submit(tasks.ident, df).result(timeout=60)
    pd.testing.assert_frame_equal(out, df)


def test_pyarrow_arrays_and_tables_round_trip(pool):
    t = pa.table({
        "x": pa.array(np.arange(200_000, dtype=np.int64)),
        "y": pa.array([None if i % 7 == 0 else float(i) for i in range(200_000)]),
        "s": pa.array([str(i) for i in range(200_000)]),
    })
    out = pool.submit(tasks.ident, t).result(timeout=60)
    assert out.equals(t)
    arr = pa.array(np.arange(1_000_000, dtype=np.float32))
    assert pool.submit(tasks.ident, arr).result(timeout=60).equals(arr)


def test_polars_frames_and_series_round_trip(pool):
    df = pl.DataFrame({
        "a": np.arange(300_000),
        "b": np.random.default_rng(1).random(300_000),
        "s": ["k%d" % (i % 11) for i in range(300_000)],
    })
    out = pool.submit(tasks.ident, df).result(timeout=60)
    assert isinstance(out, pl.DataFrame)
    assert out.equals(df)
    s = pl.Series("v", np.arange(50_000, dtype=np.int32))
    got = pool.submit(tasks.ident, s).result(timeout=60)
    assert isinstance(got, pl.Series) and got.equals(s)


def test_nested_structures_with_many_buffers(pool):
    obj = {"arrays": [np.full(10_000, i, dtype=np.int16) for i in range(50)], "meta": ("x", 1, None)}
    out = pool.submit(tasks.ident, obj).result(timeout=60)
    assert out["meta"] == ("x", 1, None)
    assert all(np.array_equal(a, b) for a, b in zip(obj["arrays"], out["arrays"]))


def test_malformed_payloads_are_clear_errors_not_crashes():
    from pymizu import _native

    for bad in [b"", b"Z123", b"p\x00\x00\x00", b"p\x00\x00\x00\xff\xff\xff\x7f" + b"\x00" * 8,
                b"p\x00\x00\x00\x01\x00\x00\x00" + (10**6).to_bytes(8, "little") + b"\x00" * 24,
                b"K" + (5).to_bytes(8, "little")]:
        with pytest.raises(ValueError, match="malformed"):
            _native.decode_payload(bad)
    data, bufs = _native.decode_payload(b"P" + __import__("pickle").dumps(5))
    assert __import__("pickle").loads(data, buffers=bufs) == 5


def test_no_shared_memory_is_left_after_stop():
    def mine():
        me = f"mizu_{os.getpid():x}_"
        return {n for n in os.listdir("/dev/shm") if n.startswith(me) and not n.endswith(".lock")}

    before = mine()
    with pymizu.Pool(2) as p:
        p.submit(tasks.ident, np.zeros(3_000_000)).result(timeout=60)
        p.map(tasks.ident, [np.ones(100_000)] * 20)
        kept = p.submit(tasks.ident, np.ones(1_000_000)).result(timeout=60)
    del kept
    assert mine() - before == set()


def test_a_received_array_sent_on_crosses_by_reference():
    with pymizu.Pool(1) as p:
        a = np.arange(1_000_000, dtype=np.float64)
        r = p.submit(tasks.ident, a).result(timeout=60)  # copied once, into our region
        assert shm_backed(r)
        r2 = p.submit(tasks.ident, r).result(timeout=60)  # there and back by reference
        assert np.shares_memory(r, r2) and np.array_equal(r2, a)
        s = p.submit(tasks.ident, r2[10:500_010]).result(timeout=60)  # a contiguous slice
        assert np.shares_memory(s, r) and np.array_equal(s, a[10:500_010])
        f = p.submit(tasks.ident, np.asfortranarray(a.reshape(1000, 1000))).result(timeout=60)
        f2 = p.submit(tasks.ident, f).result(timeout=60)
        assert f2.flags.f_contiguous and np.shares_memory(f, f2)
        assert np.array_equal(f2, a.reshape(1000, 1000))
        # In containers and as keyword arguments, and after the first holder is gone.
        got = p.submit(tasks.kw_pair, [r, 1], b={"x": r2}).result(timeout=60)
        del r, r2
        import gc

        gc.collect()
        assert np.array_equal(got[0][0], a) and np.shares_memory(got[0][0], got[1]["x"])
        assert not got[1]["x"].flags.writeable


def shm_growth_mb(round_) -> float:
    """How much this process's /dev/shm segments grow over two more runs of `round_` after a
    first one (which may add segments that are then reused)."""
    import gc

    def mb():
        me = f"mizu_{os.getpid():x}_"
        names = [n for n in os.listdir("/dev/shm") if n.startswith(me)]
        return sum(os.path.getsize(os.path.join("/dev/shm", n)) for n in names) / 2**20

    round_()
    gc.collect()
    after_one = mb()
    for _ in range(2):
        round_()
        gc.collect()
    return mb() - after_one


def test_arrays_by_reference_are_given_back_when_nobody_reads_them():
    # Each task below refers to an 8 MB region of ours; one that is never read must give the
    # reference back, or the region (and its segment) stays until the pool stops.
    with pymizu.Pool(1) as p:
        a = np.arange(1_000_000, dtype=np.float64)
        v = p.submit(tasks.ident, a).result(timeout=60)  # a view of our region

        def round_():
            for _ in range(20):
                # Each sends `a` into a new region of ours; the result refers to it.
                t = p.submit(tasks.ident, a)
                del t  # abandoned (uncollected)
                vi = p.submit(tasks.ident, a).result(timeout=60)  # a view of a new region
                busy = p.submit(tasks.sleep, 0.005)
                q = p.submit(tasks.ident, vi)
                assert q.cancel()  # a queued input by reference, discarded
                busy.result(timeout=60)
                del vi, q
                w = p.submit(tasks.ident, a)
                while not w.done():
                    time.sleep(0.001)
                del w  # a finished outcome never read
            p.submit(tasks.ident, 1).result(timeout=60)

        # Without giving references back: +60 regions x 8 MB; segments are reused instead.
        assert shm_growth_mb(round_) < 64
        assert np.array_equal(p.submit(tasks.ident, v).result(timeout=60), a)


def shm_mb_of(pids) -> float:
    """Megabytes of /dev/shm segments made by these processes."""
    prefixes = tuple(f"mizu_{pid:x}_" for pid in pids)
    names = [n for n in os.listdir("/dev/shm") if n.startswith(prefixes)]
    total = 0
    for n in names:
        try:
            total += os.path.getsize(os.path.join("/dev/shm", n))
        except FileNotFoundError:  # removed while we looked
            pass
    return total / 2**20


def big_mb() -> int:
    """A large payload: 100 MB, or a quarter of a small /dev/shm (a container's 64 MiB)."""
    st = os.statvfs("/dev/shm")
    return int(min(100, st.f_blocks * st.f_frsize / 2**20 / 4))


def test_shared_memory_of_a_one_off_large_transfer_goes_back_after_a_pause():
    # /dev/shm is RAM: segments a large transfer needed are given back once unused for a
    # couple of seconds (in the caller and in the worker), not kept until the pool stops.
    import gc

    with pymizu.Pool(1) as p:
        pids = [os.getpid()] + [w["pid"] for w in p.status()["workers"]]
        before = shm_mb_of(pids)
        mb = big_mb()
        a = np.arange(mb * 2**20 // 8, dtype=np.float64)  # 100 MB: a region of the caller's
        b = p.submit(np.multiply, a, 2.0).result(timeout=120)  # 100 MB: a region of the worker's
        assert b[-1] == 2.0 * a[-1]
        during = shm_mb_of(pids)
        # Both 100 MB regions are held now; the caller's may sit in an idle segment an earlier
        # test left (part of `before`), the new worker's cannot.
        assert during >= 1.9 * mb and during >= before + 0.9 * mb, (before, during)
        del a, b
        gc.collect()
        deadline = time.monotonic() + 120  # a hang guard only
        while shm_mb_of(pids) > before + 1:
            assert time.monotonic() < deadline, (before, shm_mb_of(pids))
            time.sleep(0.1)
        # The pool goes on working, and makes new segments as it needs them.
        c = np.ones(2_000_000)
        assert np.array_equal(p.submit(tasks.ident, c).result(timeout=120), c)


def test_a_worker_killed_while_holding_an_input_gives_it_back():
    # The worker holds a view of our 80 MB array when it is killed (execution timeout; a
    # crash or `kill -9` is the same): a dead process gives nothing back by itself, so the pool
    # gives back what the worker's ledger lists — or our segment stays until we exit.
    import gc

    with pymizu.Pool(1, exec_timeout=1.0) as p:
        me = [os.getpid()]
        before = shm_mb_of(me)
        mb = big_mb() * 0.8
        a = np.ones(int(mb * 2**20 / 8))
        with pytest.raises(pymizu.ExecTimeoutError):
            p.submit(tasks.hold, a, 60).result(timeout=120)
        # The 80 MB array is held (maybe in a segment of `before`).
        assert shm_mb_of(me) >= 0.95 * mb
        del a
        gc.collect()
        deadline = time.monotonic() + 120  # a hang guard only
        while shm_mb_of(me) > before + 1:
            assert time.monotonic() < deadline, (before, shm_mb_of(me))
            time.sleep(0.1)
        assert p.submit(tasks.hold, np.ones(1000), 0).result(timeout=60) == 1000


def test_a_forked_child_dropping_a_view_does_not_give_back_the_parents_memory():
    # A forked child holds copies of the parent's handles, not references of its own: when it
    # drops a view, the parent's region must stay held (it was given back, then overwritten
    # by the parent's next array: silent corruption).
    import gc

    with pymizu.Pool(1) as p:
        a = np.arange(1_000_000, dtype=np.float64)
        v = p.submit(tasks.ident, a).result(timeout=60)  # a view of our region
        pid = os.fork()
        if pid == 0:
            del v
            gc.collect()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        w = p.submit(tasks.ident, np.full(1_000_000, 7.0)).result(timeout=60)
        assert np.array_equal(v, a)
        assert w[0] == 7.0


def test_malformed_references_are_clear_errors():
    from pymizu import _native

    good = _native.small_dumps(np.arange(1024, dtype=np.int64))  # an out-of-band array
    # Its buffer's entry (the first, at 16) turned into one by reference (code 0x80), the
    # reference record (a region descriptor, the offset in the region) where its bytes were.
    at = int.from_bytes(good[16:24], "little")
    entry = good[16:32] + b"\x80" + bytes(7)
    for desc in (bytes(64), b"mizu_0_0" + bytes(56), bytes(range(64))):
        bad = good[:16] + entry + good[40:at] + desc + (0).to_bytes(8, "little") + good[at + 72 :]
        with pytest.raises(ValueError, match="malformed"):
            _native.small_loads(bad)


def test_outcomes_moved_out_of_full_slots_give_references_back_when_dropped_unread():
    a = np.arange(1_000_000, dtype=np.float64)
    with pymizu.Pool(1, slots=4) as p:

        def round_():
            for _ in range(5):
                ts = [p.submit(tasks.ident, a) for _ in range(4)]  # results refer to our regions
                while not all(t.done() for t in ts):
                    time.sleep(0.001)
                extra = p.submit(tasks.ident, 1)  # every slot taken: outcomes move into tasks
                assert extra.result(timeout=60) == 1
                del ts  # ... and are dropped unread

        # Without giving references back: +40 regions x 8 MB.
        assert shm_growth_mb(round_) < 64


def mizu_shm_bytes() -> int:
    return sum(
        os.path.getsize(os.path.join("/dev/shm", f))
        for f in os.listdir("/dev/shm")
        if f.startswith("mizu_")
    )


def run_in_64_mib(tmp_path, main: str, spill=None) -> list[str]:
    """Runs `main` as the `if __name__ == "__main__":` block of a script (with `gc`, `np`,
    `pd`, `pymizu` and `tasks` imported) in a fresh interpreter whose mizu sees a 64 MiB
    `/dev/shm` (a container's default; `MIZU_SHM_BYTES`); returns its output lines. Values
    that do not fit spill to the directory `spill`; without it, spilling is off (the error of
    a full `/dev/shm`)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "in_64_mib.py"
    script.write_text(
        "import gc, sys\nimport numpy as np, pandas as pd\n"
        f"sys.path.insert(0, {os.path.dirname(tasks.__file__)!r})\n"
        "import pymizu, tasks\n\n"
        'if __name__ == "__main__":\n' + textwrap.indent(textwrap.dedent(main), "    ")
    )
    env = dict(os.environ, MIZU_SHM_BYTES=str(mizu_shm_bytes() + (64 << 20)),
               MIZU_SPILL_DIR=str(spill) if spill is not None else "none")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_a_small_dev_shm_carries_large_values_and_a_full_one_fails_clearly(tmp_path):
    # A container's /dev/shm is 64 MiB by default (MIZU_SHM_BYTES makes mizu behave so here):
    # a loop of 8 MB arrays and of 16 MB frames must go on (16 MiB segments per process, kept
    # idle for reuse by the caller while a worker needed room, made the frame's result fail);
    # what cannot fit is a clear error and the pool goes on working.
    lines = run_in_64_mib(tmp_path, """
        with pymizu.Pool(2) as p:
            a = np.random.rand(1_000_000)
            for _ in range(100):
                assert np.array_equal(p.submit(tasks.ident, a).result(timeout=60), a)
            df = pd.DataFrame({c: np.random.rand(250_000) for c in "abcdefgh"})
            for _ in range(50):
                r = p.submit(tasks.ident, df).result(timeout=60)
            assert r.equals(df)
            try:
                p.submit(tasks.ident, np.zeros(10_000_000)).result(timeout=60)
                print("80 MB fitted")
            except pymizu.MizuError as e:
                print("error:", e)
            print(p.submit(tasks.add, 1, 2).result(timeout=60))
    """)
    assert lines[0].startswith("error: no room in /dev/shm") and "--shm-size" in lines[0], lines
    assert lines[1] == "3"


def test_an_executor_for_a_machine_of_many_cpus_fits_a_small_dev_shm(tmp_path):
    # An executor with a worker slot for each of 256 CPUs (its default on such a machine), in
    # a container's 64 MiB /dev/shm: the pool's segment must leave room for values (a 16 MB
    # array travels beside it), and nested work runs in its workers' smaller records (a nested
    # map, and more nested tasks in flight than a worker's record has slots at this size).
    lines = run_in_64_mib(tmp_path, """
        with pymizu.PoolExecutor(max_workers=256) as ex:
            print(ex.submit(tasks.add, 1, 2).result(timeout=60))
            a = np.random.rand(2_000_000)
            print(np.array_equal(ex.submit(tasks.ident, a).result(timeout=60), a))
            print(ex.submit(tasks.nested_sum, 1000).result(timeout=120))
            print(ex.submit(tasks.nested_all_in_flight, 100).result(timeout=120))
    """)
    assert lines == ["3", "True", str(sum(2 * i for i in range(1000))), "5050"], lines


def test_values_too_big_for_a_small_dev_shm_spill_to_files_said_once(tmp_path):
    # A 200 MB array through a 64 MiB /dev/shm (a container's default): it goes to files in
    # the spill directory, there and back, through Pool and PoolExecutor, shared or not; the
    # first spill warns once, naming how to enlarge /dev/shm; nothing is left behind.
    spill = tmp_path / "spill"
    spill.mkdir()
    lines = run_in_64_mib(tmp_path, """
        import operator, warnings
        a = np.random.rand(25_000_000)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pymizu.Pool(1) as p:
                print("pool", np.array_equal(p.submit(tasks.ident, a).result(timeout=120), a))
                b = a * 2
                print("again", np.array_equal(p.submit(tasks.ident, b).result(timeout=120), b))
                del b
            with pymizu.PoolExecutor(1) as ex:
                print("executor", np.array_equal(ex.submit(tasks.ident, a).result(timeout=120), a))
            s = pymizu.share(a)
            with pymizu.Pool(2) as p:
                ts = [p.submit(operator.getitem, s, i) for i in range(100)]
                print("shared", [t.result(timeout=120) for t in ts] == list(a[:100]))
            del s
        said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
        print("warned", len(said), "--shm-size" in said[0], "MIZU_SPILL_DIR" in said[0])
    """, spill=spill)
    assert lines == ["pool True", "again True", "executor True", "shared True",
                     "warned 1 True True"], lines
    assert list(spill.iterdir()) == [], "nothing left in the spill directory"


def test_a_worker_short_of_dev_shm_collects_its_garbage_before_failing(tmp_path):
    # A worker keeps a 40 MiB input alive in a garbage cycle; its next result (20 MiB) fits in
    # the 64 MiB /dev/shm only once that cycle is collected (the R worker runs R's collector
    # the same way). Before, the result failed as "no room in /dev/shm".
    lines = run_in_64_mib(tmp_path, """
        with pymizu.Pool(1) as p:
            a = np.random.rand(5_242_880)
            assert p.submit(tasks.drop_in_a_cycle, a).result(timeout=60) == len(a)
            del a
            r = p.submit(tasks.ones_after, 2_621_440).result(timeout=60)
            print(len(r), r.sum())
    """)
    assert lines == ["2621440 2621440.0"], lines


def test_a_caller_short_of_dev_shm_collects_its_garbage_before_failing(tmp_path):
    # The caller keeps a 40 MiB result (a view of the worker's memory) in a garbage cycle;
    # its next 20 MiB argument fits in the 64 MiB /dev/shm only once that cycle is collected.
    lines = run_in_64_mib(tmp_path, """
        with pymizu.Pool(1) as p:
            gc.disable()
            r = p.submit(tasks.ones_after, 5_242_880).result(timeout=60)
            cycle = [r]
            cycle.append(cycle)
            del r, cycle
            a = np.random.rand(2_621_440)
            print(p.submit(tasks.ident, a).result(timeout=60).sum() == a.sum())
    """)
    assert lines == ["True"], lines


def test_a_process_leaving_with_views_alive_leaves_nothing_in_dev_shm(tmp_path):
    # Python does not drop every object at exit (here an exception's traceback holds a view
    # and the pool): the process's lock file used to stay behind until a prune.
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "leave.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import numpy as np
        sys.path.insert(0, %r)
        import pymizu, tasks

        if __name__ == "__main__":
            p = pymizu.Pool(1)
            v = p.submit(tasks.ident, np.ones(1_000_000)).result(timeout=60)
            print(os.getpid(), flush=True)
            raise RuntimeError("leaving with a view and a pool alive")
    """ % os.path.dirname(tasks.__file__)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert "leaving with a view" in out.stderr
    pid = int(out.stdout.strip())
    left = [f for f in os.listdir("/dev/shm") if f.startswith(f"mizu_{pid:x}_")]
    assert left == []
