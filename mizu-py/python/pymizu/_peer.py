"""A channel peer: `python -m pymizu._peer <source file> <token>` (started by `Channel.spawn`)."""

import sys

from ._channel import Channel


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python -m pymizu._peer <source file> <token>")
    with open(sys.argv[1]) as f:
        source = f.read()
    channel = Channel.attach(sys.argv[2])
    try:
        exec(compile(source, "<pymizu channel peer>", "exec"), {"__name__": "__pymizu_peer__", "channel": channel})
    finally:
        channel.close()


if __name__ == "__main__":
    main()
