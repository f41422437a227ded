"""Structure-aware fuzzing of pymizu's native decoders: the compact codec of small calls and
results, the out-of-band payload (a pickle and its buffers), the wire-format frames, and what
a Python pool or worker reads of another language's payloads (results and errors as R sends
them — the cross-language golden corpus — and tasks and map chunks). Each starts from valid
payloads the encoders wrote and mutates them (byte flips, truncation, insertions, splices of
another seed); every input must decode or raise the decoder's own error (ValueError; MizuError
for cross-language payloads, or the task error an error payload stands for) — anything else
(another exception, a crash of the interpreter) fails.

    python mizu-py/tests/fuzz_codecs.py CASES   (per decoder; run by `cargo xtask fuzz`)

The layouts' own parsers are fuzzed from Rust too (`mizu-wire/tests/fuzz.rs`); this covers
the Python objects the bindings build from what they parse.
"""

import glob
import os
import pickle
import random
import sys

import numpy as np

from pymizu import _native
from pymizu._xlang import TaskError
from pymizu.wire import Call

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "mizu-wire", "tests", "corpus", "xlang")

SMALL = [
    None, True, 0, -(2**63), 2**63 - 1, 1.5, float("nan"), "", "héllo ✓", b"\x00\xff",
    (), (1, "a", [2.0, None]), {"a": 1, (1, 2): [3.0], 5: {"x": b"y"}}, [[[[1]]]],
    np.arange(6, dtype=np.int32).reshape(2, 3), np.asfortranarray(np.ones((3, 2))),
    np.array(["2024-01-02"], dtype="datetime64[D]"), np.zeros(0, dtype=np.uint8),
]


def small_seeds():
    seeds = [_native.small_dumps(v) for v in SMALL]
    # `K` holding a call item of a pickled function (docs/wire-format.md §3), its arguments,
    # keywords.
    args = _native.small_dumps((1, "x", [2.0]))[2:]
    seeds.append(b"K\x0b\x02\x02fn" + args + b"\x00")
    seeds.append(b"K\x0b\x02\x02fn" + args + _native.small_dumps({"k": 1})[2:])
    return [s for s in seeds if s is not None]


def oob_seeds():
    """`p` payloads as pymizu lays them out: header, table, pickle, 64-byte aligned buffers."""
    out = []
    for arrays in ([np.arange(1000.0)], [np.arange(10, dtype=np.int8), np.ones((50, 3))], []):
        bufs = []
        data = pickle.dumps(arrays, protocol=5, buffer_callback=bufs.append)
        raws = [b.raw().tobytes() for b in bufs]
        n = len(raws)
        head = bytearray(b"p\x00\x00\x00" + n.to_bytes(4, "little") + len(data).to_bytes(8, "little"))
        table_end = 16 + 24 * n
        at = -(-(table_end + len(data)) // 64) * 64
        body = bytearray()
        for r in raws:
            head += at.to_bytes(8, "little") + len(r).to_bytes(8, "little") + bytes(8)
            body += r + b"\x00" * (-len(r) % 64)
            at += len(r) + (-len(r) % 64)
        payload = bytes(head) + data
        payload += b"\x00" * (-len(payload) % 64) + bytes(body)
        out.append(payload)
    out.append(b"P" + pickle.dumps({"x": 1}))
    return out


def wire_seeds():
    values = [None, 1, -2.5, "水", b"\x00" * 3, [1, [2, [3]]], {"a": 1},
              np.arange(10, dtype=np.int64), np.array([1.0, np.nan])]
    return [_native.wire_dumps(v, i) for i, v in enumerate(values)]


def xlang_value_seeds():
    """Values and errors as either language sends them (the golden corpus), and a few more."""
    seeds = []
    for p in sorted(glob.glob(os.path.join(CORPUS, "*.bin"))):
        with open(p, "rb") as f:
            seeds.append(f.read())
    seeds += [_native.xlang_dumps(v) for v in ([1.5, "x", None], {"a": np.arange(3.0)})]
    return seeds


def xlang_task_seeds():
    """Tasks and map chunks as a Python pool sends them to another language's workers."""
    call = Call("stats::median", False, [np.arange(5.0), "水", [1, None]], {"na_rm": True})
    return [
        _native.xlang_task_dumps(call),
        _native.xlang_task_dumps(Call("function(x) x + 1", True, [], {})),
        _native.xlang_task_dumps(call, [1.5, "a", np.arange(4, dtype=np.int32)]),
    ]


def mutate(rng, seed, seeds):
    b = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif op == 3 and len(b) >= 8:
            # A length or offset word: set it to something near a boundary.
            i = rng.randrange(len(b) - 7)
            b[i:i + 8] = rng.choice([0, 1, len(b), 2**31, 2**63, 2**64 - 1]).to_bytes(8, "little")
        else:
            other = rng.choice(seeds)
            cut = rng.randrange(len(b) + 1)
            b[cut:] = other[rng.randrange(len(other) + 1):]
    return bytes(b)


def run(name, decode, seeds, cases, rng, errors=(ValueError,)):
    decoded = refused = 0
    for i in range(cases):
        b = mutate(rng, seeds[i % len(seeds)], seeds)
        try:
            decode(b)
            decoded += 1
        except errors:
            refused += 1
    said = " or ".join(e.__name__ for e in errors)
    print(f"fuzz {name}: {cases} cases, {decoded} decoded, {refused} refused with {said}")
    assert refused > 0, f"{name}: no mutation was refused (the harness is not mutating)"


def main():
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    for s in small_seeds():
        _native.small_loads(s)
    for s in oob_seeds():
        _native.decode_payload(s)
    for s in wire_seeds():
        _native.wire_loads(s)
    for s in xlang_task_seeds():
        _native.xlang_task_loads(s)
    for s in xlang_value_seeds():
        try:
            _native.xlang_loads(s)
        except TaskError:
            pass  # an error payload stands for the task error it raises
    run("compact codec", _native.small_loads, small_seeds(), cases, rng)
    run("out-of-band payload", _native.decode_payload, oob_seeds(), cases, rng)
    run("wire frames", _native.wire_loads, wire_seeds(), cases, rng)
    run("cross-language results", _native.xlang_loads, xlang_value_seeds(), cases, rng,
        (_native.MizuError, TaskError))
    run("cross-language tasks", _native.xlang_task_loads, xlang_task_seeds(), cases, rng,
        (_native.MizuError,))


if __name__ == "__main__":
    main()
