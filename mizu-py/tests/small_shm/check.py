"""What a container's 64 MiB /dev/shm must carry, run by `cargo xtask test` inside a private
mount namespace with a 64 MiB tmpfs over /dev/shm (not collected by pytest: outside such a
namespace it refuses to run). Values too big for /dev/shm spill to files in the spill
directory — the system's temporary directory here, as a user would get it — there and back,
through Pool and PoolExecutor, shared or not, across languages; kill -9 of a pool's owner
leaves nothing; a spill directory that fills up is a clear error naming it, leaving nothing."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np

import pymizu

MIB = 1 << 20


def mizu_files(where: str) -> list[str]:
    return sorted(n for n in os.listdir(where) if n.startswith("mizu_") and not n.endswith(".lock"))


def spilled_files() -> list[str]:
    return [n for n in mizu_files(tempfile.gettempdir()) if n.endswith("s")]


def check(what: str, ok: bool) -> None:
    print(f"{'ok ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        sys.exit(1)


def run(code: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def main() -> None:
    st = os.statvfs("/dev/shm")
    if st.f_blocks * st.f_frsize > 64 * MIB:
        sys.exit("small_shm/check.py runs in a namespace with a 64 MiB /dev/shm (cargo xtask test)")
    a = np.random.rand(25_000_000)  # 200 MB
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pymizu.Pool(1) as p:
            check("Pool: 200 MB there and back", np.array_equal(p.submit(np.copy, a).result(timeout=300), a))
        with pymizu.PoolExecutor(1) as ex:
            check("PoolExecutor: 200 MB there and back",
                  np.array_equal(ex.submit(np.copy, a).result(timeout=300), a))
        s = pymizu.share(a)
        with pymizu.Pool(2) as p:
            import operator
            ts = [p.submit(operator.getitem, s, i) for i in range(100)]
            check("a shared 200 MB array read by 100 tasks", [t.result(timeout=300) for t in ts] == list(a[:100]))
        del s
    said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    check("the first spill warns once, saying how to enlarge /dev/shm",
          len(said) == 1 and "--shm-size" in said[0] and "64 MiB" in said[0])

    # A 1 M-row, 10-column data frame, Python -> R worker -> Python.
    if os.environ.get("R_LIBS"):
        import pandas as pd
        import pyarrow as pa

        df = pd.DataFrame({f"c{i}": np.random.rand(1_000_000) for i in range(10)})
        with pymizu.Pool(1, language="r") as rp:
            back = pa.table(rp.submit(pymizu.call("identity", df)).result(timeout=300)).to_pandas()
        check("a 1 M-row data frame through an R worker and back", back.equals(df))
    else:
        check("R_LIBS names the mizu R package's library (for the cross-language row)", False)

    # kill -9 of a pool's owner holding spilled values: its workers notice, and nothing is left.
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, numpy as np, pymizu
        p = pymizu.Pool(2)
        a = np.random.rand(12_500_000)
        r = p.submit(np.copy, a).result(timeout=300)
        print(" ".join(str(w[1]) for w in p._pool.status()), flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    workers = [int(x) for x in owner.stdout.readline().split()]
    check("the owner's 100 MB spilled", any(n.startswith(f"mizu_{owner.pid:x}_") for n in spilled_files()))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 60  # a hang guard, not a bound
    ours = [owner.pid] + workers
    def left():
        return [n for n in spilled_files() + mizu_files("/dev/shm")
                if any(n.startswith(f"mizu_{p:x}_") for p in ours)]
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    check("kill -9 of the owner leaves nothing in the spill directory or /dev/shm", left() == [])

    # A spill directory that fills up: a clear error naming it; nothing left anywhere.
    tiny = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", tiny], check=True)
    try:
        out = run("""
            import numpy as np, pymizu
            with pymizu.Pool(1) as p:
                try:
                    p.submit(np.copy, np.random.rand(25_000_000)).result(timeout=300)
                    print("fitted")
                except pymizu.MizuError as e:
                    print("error", e)
                print(p.submit(abs, -3).result(timeout=60))
        """, env={"MIZU_SPILL_DIR": tiny})
        lines = out.stdout.splitlines()
        check(f"a full spill directory is a clear error naming it ({out.stderr.strip()[-200:]})",
              len(lines) == 2 and lines[0].startswith("error") and tiny in lines[0] and lines[1] == "3")
        check("nothing left in the full spill directory", os.listdir(tiny) == [])
    finally:
        subprocess.run(["umount", tiny], check=False)
        os.rmdir(tiny)
    check("nothing of this process left spilled", not any(
        n.startswith(f"mizu_{os.getpid():x}_") for n in spilled_files()))


if __name__ == "__main__":
    main()
