"""`Channel`: messages between this process and one peer process over shared-memory rings."""

from __future__ import annotations

import operator
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from . import _codec, _native


class _Sentinel:
    """A falsy marker returned (never raised) by `send` / `recv`."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"pymizu.{self._name}"

    def __reduce__(self):
        return self._name


FULL = _Sentinel("FULL")
TIMEOUT = _Sentinel("TIMEOUT")
CLOSED = _Sentinel("CLOSED")
PEER_GONE = _Sentinel("PEER_GONE")
_SEND = {1: FULL, 2: CLOSED, 3: PEER_GONE}
_RECV = {1: TIMEOUT, 2: CLOSED, 3: PEER_GONE}


class Channel:
    """One end of a two-process channel.

    `Channel.spawn(source)` starts a peer process running the Python `source` with a global
    `channel` (its end); `Channel.attach(token)` is the peer's side for a channel made
    elsewhere. `send(obj)` never blocks: it returns True, or `FULL`, `CLOSED` or `PEER_GONE`;
    `recv(timeout)` returns the next object, or `TIMEOUT`, `CLOSED` (the peer closed and
    everything it sent was read) or `PEER_GONE` (it died). The sentinels are falsy. Iterating
    yields messages until `CLOSED` or `PEER_GONE`. Large buffers cross as read-only views of
    shared memory, as in pools. A context manager: leaving it closes the channel and waits for
    a spawned peer.
    """

    def __init__(self, native, foreign: bool = False):
        self._c = native
        # A peer of another language: messages are cross-language values (docs/interop.md).
        self._foreign = foreign

    @classmethod
    def spawn(
        cls,
        source: str,
        *,
        capacity: int | None = None,
        slot_size: int | None = None,
        timeout: float = 30.0,
        language: str = "python",
    ) -> "Channel":
        """Starts a peer running `source` with `channel` (its end) defined: Python
        (`python -m pymizu._peer`) or, with `language="r"`, R code in `Rscript` with the mizu R
        package (messages then cross as `docs/interop.md` says). Each direction holds
        `capacity` messages (default 1 024) in slots of `slot_size` bytes (default 1 024; a
        longer message goes through a shared-memory region), both rounded up to a power of
        two."""
        if language not in ("python", "r"):
            raise ValueError(f'language must be "python" or "r", got {language!r}')
        sizes = []
        for name, v in (("capacity", capacity), ("slot_size", slot_size)):
            try:
                n = None if v is None else operator.index(v)
            except TypeError:
                n = 0
            if n is not None and n < 1:
                raise ValueError(f"{name} must be a positive int (or None), got {v!r}")
            sizes.append(n)
        capacity, slot_size = sizes
        suffix = ".R" if language == "r" else ".py"
        fd, path = tempfile.mkstemp(prefix="pymizu-peer-", suffix=suffix)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        try:
            if language == "r":
                from ._pool import _r_worker_command

                rscript, _ = _r_worker_command(None)
                args = ["--no-save", "--no-restore", "--no-echo", "-e", "mizu:::.channel_main_x()", path]
                return cls(_native.Channel.launch(rscript, args, capacity, slot_size, timeout), True)
            return cls(_native.Channel.launch(sys.executable, ["-m", "pymizu._peer", path], capacity, slot_size, timeout))
        finally:
            os.unlink(path)  # the peer read it before attaching

    @classmethod
    def attach(cls, token: str, *, language: str = "python") -> "Channel":
        """The other end of a channel whose token this process was given (`language`: the
        other end's)."""
        return cls(_native.Channel.attach(token), language != "python")

    @property
    def token(self) -> str:
        """What a peer passes to `Channel.attach`."""
        return self._c.token

    def send(self, obj: Any):
        """Sends `obj` without blocking: True, or `FULL` / `CLOSED` / `PEER_GONE`."""
        if self._foreign:
            n, status = self._c.send_values([obj])
        else:
            n, status = self._c.send_batch([_codec.dumps(obj)])
        return True if n == 1 else _SEND[status]

    def send_batch(self, objs: Iterable[Any]):
        """Sends as many of `objs` as fit now, with one publication: how many were sent
        (`CLOSED` / `PEER_GONE` when none could be)."""
        if self._foreign:
            n, status = self._c.send_values(list(objs))
        else:
            n, status = self._c.send_batch([_codec.dumps(o) for o in objs])
        if n == 0 and status in (2, 3):
            return _SEND[status]
        return n

    def recv(self, timeout: float | None = None):
        """The next message, or `TIMEOUT` / `CLOSED` / `PEER_GONE` (waits with the GIL
        released; Ctrl-C interrupts)."""
        status, data, bufs = self._c.recv(timeout)
        if status == 0:
            return _codec.loads(data, buffers=bufs)
        if status == 4:
            return data
        return _RECV[status]

    def recv_batch(self, max_items: int, timeout: float | None = None) -> list:
        """Up to `max_items` messages: waits for the first, then takes what is ready."""
        out = []
        first = self.recv(timeout)
        if isinstance(first, _Sentinel):
            return out
        out.append(first)
        while len(out) < max_items:
            m = self.recv(0.0)
            if isinstance(m, _Sentinel):
                break
            out.append(m)
        return out

    def __iter__(self) -> Iterator[Any]:
        while True:
            m = self.recv()
            if m is CLOSED or m is PEER_GONE:
                return
            yield m

    def close(self) -> None:
        """Closes this end: the peer reads what was sent, then gets `CLOSED`."""
        self._c.close()

    def join(self, timeout: float = 5.0) -> int | None:
        """Closes, then waits for a spawned peer to exit (killed after `timeout`); its exit code."""
        return self._c.finish(timeout)

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.join()
