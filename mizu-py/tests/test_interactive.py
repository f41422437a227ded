"""Functions and classes a worker cannot import from the caller's `__main__` run on pymizu's
workers all the same (they travel by value): what `python -c`, the REPL, a script read from
stdin or a real Jupyter kernel defines, a script without a `__main__` guard, and what a script
defines under its guard."""

import subprocess
import sys
import textwrap

SESSION = textwrap.dedent(
    """
    import pymizu

    def sq(x):
        return x * x

    class Point:
        def __init__(self, v):
            self.v = v

    def twice(p):
        return p.v * 2

    print(pymizu.Pool(2).submit(sq, 7).result())
    with pymizu.PoolExecutor(2) as ex:
        print(list(ex.map(sq, range(5))), ex.submit(twice, Point(21)).result(), ex.submit(lambda: 5).result())

    with pymizu.Pool(2) as p:
        print(p.map(sq, range(4)), p.map(twice, [Point(1), Point(2)]))
    """
)
EXPECTED = ["49", "[0, 1, 4, 9, 16] 42 5", "[0, 1, 4, 9] [2, 4]"]


def _run(args, cwd="/tmp", **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=180, cwd=cwd, **kw)
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")


def test_python_dash_c():
    out = _run([sys.executable, "-c", SESSION])
    assert out[:3] == EXPECTED


def test_the_repl():
    out = _run([sys.executable, "-i", "-q"], input=SESSION + "\n")
    assert [line for line in out if line.strip()][:3] == EXPECTED


def test_a_jupyter_kernel_runs_a_notebook():
    import nbformat
    from nbclient import NotebookClient

    cells = [nbformat.v4.new_code_cell(c) for c in SESSION.strip().split("\n\n")]
    nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    texts = [
        o.get("text", "")
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    ]
    lines = [line for t in texts for line in t.split("\n") if line.strip()]
    assert lines == EXPECTED


def test_a_script_read_from_stdin():
    out = _run([sys.executable, "-"], input=SESSION)
    assert out[:3] == EXPECTED


# Under the guard: a class, a function calling a top-level one, a function returning an instance
# of the guard's class (it comes back as that class), and a global that a top-level function
# reads through another. The top-level function that reads no such global still goes by name.
GUARDED = textwrap.dedent(
    """
    import pickle
    import pymizu
    from pymizu import _codec

    def top(x):
        return x + 1

    def scaled(x):
        return top(x) * FACTOR

    if __name__ == "__main__":
        FACTOR = 3

        class Box:
            def __init__(self, v):
                self.v = v

        def under(x):
            return top(x) * 10

        def make(v):
            return Box(v)

        # By name, `top` unpickles to itself; by value, `under` to a copy. In an argument too,
        # beside strings that spell the guard's variables (`b`, `ex`, `p`), which are never
        # pickled by name.
        top_arg = pickle.loads(_codec.dumps((top, "b ex p"))[0])[0]
        under_arg = pickle.loads(_codec.dumps([under])[0])[0]
        print(pickle.loads(_codec.fn_ref(top)) is top, pickle.loads(_codec.fn_ref(under)) is not under,
              top_arg is top, under_arg is not under)
        with pymizu.PoolExecutor(2) as ex:
            b = ex.submit(make, 5).result()
            print(list(ex.map(under, range(4))), type(b) is Box, b.v, ex.submit(lambda x: x.v, Box(4)).result())
        with pymizu.Pool(2) as p:
            print(p.map(under, range(3)), sorted(p.imap_unordered(under, range(3))))
            print(p.map(scaled, range(3)), p.submit(scaled, 4).result())
    """
)


def test_what_a_script_defines_under_its_guard(tmp_path):
    (tmp_path / "guarded.py").write_text(GUARDED)
    out = _run([sys.executable, "guarded.py"], cwd=tmp_path)
    assert out[:4] == ["True True True True", "[10, 20, 30, 40] True 5 4", "[10, 20, 30] [10, 20, 30]", "[3, 6, 9] 15"]


# No guard: importing the script in a worker would run it again (and make a pool there), so the
# workers do not import it; its body runs once, in the caller.
UNGUARDED = textwrap.dedent(
    """
    import pymizu
    SCALE = 3
    print("body")

    def f(x):
        return x * SCALE

    class Pt:
        def __init__(self, v):
            self.v = v

    def g(p):
        return Pt(p.v + 1)

    with pymizu.PoolExecutor(2) as ex:
        r = ex.submit(g, Pt(1)).result()
        print(list(ex.map(f, range(4))), type(r) is Pt, r.v)
    with pymizu.Pool(2) as p:
        print(p.map(f, range(3)))
    """
)


def test_a_script_without_a_guard(tmp_path):
    (tmp_path / "plain.py").write_text(UNGUARDED)
    out = _run([sys.executable, "plain.py"], cwd=tmp_path)
    assert out == ["body", "[0, 3, 6, 9] True 2", "[0, 3, 6]", ""]


def test_a_module_without_a_guard_run_with_dash_m(tmp_path):
    (tmp_path / "plainmod.py").write_text(UNGUARDED)
    out = _run([sys.executable, "-m", "plainmod"], cwd=tmp_path)
    assert out == ["body", "[0, 3, 6, 9] True 2", "[0, 3, 6]", ""]


def test_a_package_run_with_dash_m(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "__main__.py").write_text(UNGUARDED)
    out = _run([sys.executable, "-m", "app"], cwd=tmp_path)
    assert out == ["body", "[0, 3, 6, 9] True 2", "[0, 3, 6]", ""]


def test_the_names_that_travel_by_value_are_read_from_the_script(tmp_path):
    from pymizu import _main

    script = tmp_path / "s.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            LIMIT = 1

            def by_name(x, i=0):
                n = x + i  # `n` and `i` are its own, though the guard binds them too
                return [n for n in range(n)]

            def reads_limit(x):
                return x < LIMIT  # bound outside the guard as well: the guard rebinds it

            def bumps_limit(x):
                global LIMIT  # assigned here, and still the module's
                LIMIT = LIMIT + x

            class UsesConfig:
                def get(self):
                    return CONFIG

            def through(x):
                return UsesConfig().get()

            if __name__ == "__main__":
                CONFIG = {}
                LIMIT = 5
                for i in range(3):
                    n = i

                def local_to_guard():
                    pass
            """
        )
    )
    names = _main._by_value_names(str(script))
    assert names == {"reads_limit", "bumps_limit", "UsesConfig", "through", "local_to_guard"}
    # A name bound to a value is never pickled by name: the guard's variables only mark the
    # functions that read them.
    script.write_text("def f():\n    pass\nf()\n")
    assert _main._by_value_names(str(script)) is None


BY_VALUE_ONCE = textwrap.dedent(
    """
    import cloudpickle, dask, joblib, pymizu, pymizu.joblib

    by_value = []
    real = cloudpickle.dumps
    cloudpickle.dumps = lambda obj, *a, **k: by_value.append(obj) or real(obj, *a, **k)

    def g(i):
        return i + 1

    def apply_to(f, x):
        return f(x)

    want = [i + 1 for i in range(3000)]
    with pymizu.Pool(2) as p:
        assert p.map(g, range(3000)) == want
        assert sorted(p.imap_unordered(g, range(3000))) == want
        assert p.starmap(g, [(i,) for i in range(3000)]) == want
    with pymizu.PoolExecutor(2) as ex:
        assert list(ex.map(g, range(3000))) == want
    with joblib.parallel_config(backend="mizu", n_jobs=2):
        assert joblib.Parallel()(joblib.delayed(g)(i) for i in range(3000)) == want
        assert joblib.Parallel(batch_size=7)(joblib.delayed(g)(i) for i in range(3000)) == want
    # Functions among a call's arguments: Dask's tasks, a callback passed on.
    with pymizu.PoolExecutor(2) as ex:
        parts = [dask.delayed(g)(i) for i in range(300)]
        assert dask.delayed(sum)(parts).compute(scheduler=ex) == sum(want[:300])
        twice = lambda x: 2 * x
        assert [ex.submit(apply_to, twice, i).result() for i in range(300)] == [2 * i for i in range(300)]
    # Whole calls, chunks or batches pickled by value, and all pickles by value.
    print(sum(type(o) in (tuple, list) for o in by_value), len(by_value))

    # A byte string that says `__main__` beside a real reference to `__main__`: still by value.
    class Box:
        def __init__(self, v):
            self.v = v

    def unbox(tag, b):
        return tag, b.v

    with pymizu.Pool(2) as p:
        print(p.submit(unbox, b"__main__", Box(7)).result())
    """
)


def test_a_function_of_main_is_pickled_by_value_once(tmp_path):
    # A function of `__main__` travels by value; a map's chunks, joblib's batches, Dask's
    # tasks and calls that pass it on carry the pickle kept for it, made once, not a pickle by
    # value of each chunk, batch or call with it.
    script = tmp_path / "unguarded.py"
    script.write_text(BY_VALUE_ONCE)
    for args in ([sys.executable, "-c", BY_VALUE_ONCE], [sys.executable, str(script)]):
        out = _run(args, cwd=str(tmp_path))
        # Only functions went by value (`g`, `apply_to`, `twice`; a function first submitted
        # from a script's top level goes as a template, then as itself), never a call's
        # arguments with them: 587 pickles by value of whole chunks and batches before.
        calls, pickles = map(int, out[0].split())
        assert calls == 0 and pickles <= 6, out
        assert out[1] == "(b'__main__', 7)", out
