"""Reproducible random numbers: inside element `i` of a map run with `seed=`,
`current_rng()` is a `numpy.random.Generator` over the mizu-rng stream of `(seed, offset + i)`
— `numpy.random.Philox(key=seed, counter=(offset + i) << 128)` — and the stdlib `random` module
is seeded from the first 64-bit word of that stream. Results do not depend on the worker
count, the chunk size or which worker ran the element."""

from __future__ import annotations

from . import _native
from ._native import MizuError

_seed: int | None = None
_index = 0
_rng = None


def check_seed(seed) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return seed


def enter(seed: int, index: int) -> None:
    """Called before element `index` of a seeded map runs."""
    global _seed, _index, _rng
    _seed, _index, _rng = seed, index, None
    import random  # (here: it costs every worker's start-up ~1.5 ms)

    random.seed(_native.stream_word(seed, index))


def leave() -> None:
    global _seed, _rng
    _seed, _rng = None, None


def current_rng():
    """The `numpy.random.Generator` of the map element being run (see the module docs).

    Raises `MizuError` outside an element of a map run with `seed=`.
    """
    global _rng
    if _seed is None:
        raise MizuError("current_rng() is only available inside an element of a map run with seed=")
    if _rng is None:
        import numpy as np

        _rng = np.random.Generator(np.random.Philox(key=_seed, counter=_index << 128))
    return _rng
