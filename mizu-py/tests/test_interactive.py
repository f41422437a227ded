"""Functions and classes defined where `__main__` has no file — `python -c`, the REPL, a real
Jupyter kernel — run on pymizu's workers (they travel by value)."""

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


def _run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=180, cwd="/tmp", **kw)
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
