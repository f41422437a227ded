"""A channel peer: `python -m pymizu._peer [--xlang] <source file> <token>` (started by
`Channel.spawn`, or with --xlang by R's `mizu_channel(language = "python")`)."""

import sys

from ._channel import Channel


def main() -> None:
    argv = sys.argv[1:]
    # --xlang: the other end is R (mizu_channel(language = "python")): cross-language values.
    foreign = bool(argv) and argv[0] == "--xlang"
    if foreign:
        argv = argv[1:]
    if len(argv) != 2:
        sys.exit("usage: python -m pymizu._peer [--xlang] <source file> <token>")
    with open(argv[0]) as f:
        source = f.read()
    channel = Channel.attach(argv[1], language="r" if foreign else "python")
    try:
        exec(compile(source, "<pymizu channel peer>", "exec"), {"__name__": "__pymizu_peer__", "channel": channel})
    finally:
        channel.close()


if __name__ == "__main__":
    main()
