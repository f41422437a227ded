"""Draws the results `cargo xtask bench` wrote (bench.py's and bench.R's JSON) as one SVG chart
per language: the trivial round trip and the pipelined throughput, mizu beside each peer of the
same run, on log scales.

    python mizu-py/benchmarks/charts.py docs/bench/python.json docs/bench/r.json

writes docs/bench/python.svg and docs/bench/r.svg (next to each input). Only the standard
library is used.
"""

import json
import math
import sys
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH = 860
LABEL = 250  # room for the peers' names
BARS = 470  # the longest bar
BAR_H = 18
GAP = 8
MIZU, PEER = "#1f77b4", "#b0b0b0"


def is_mizu(name: str) -> bool:
    return name == "mizu" or name.startswith("pymizu")


def panels(doc: dict) -> list[tuple[str, str, list[tuple[str, float]]]]:
    """(title, unit, [(peer, value)]) for the round trip (time) and the throughput (tasks/s)."""
    rows = {r["measure"]: r for r in doc["rows"]}
    out = []
    rt = rows[doc["round_trip"]]
    scale = {"us": 1.0, "s": 1e6, "ms": 1e3}[rt["unit"]]
    out.append((
        f"{doc['round_trip']} (µs, log scale: shorter is better)",
        "µs",
        [(k, v * scale) for k, v in rt["values"].items() if v is not None],
    ))
    tp = rows[doc["throughput"]]
    if tp["unit"] == "k tasks/s":
        vals = [(k, v * 1e3) for k, v in tp["values"].items() if v]
    else:  # seconds per task
        vals = [(k, 1.0 / v) for k, v in tp["values"].items() if v]
    out.append((f"{doc['throughput']} (tasks/s, log scale: longer is better)", "tasks/s", vals))
    return out


def num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def fmt(v: float, unit: str) -> str:
    """`v` in `unit` (µs or tasks/s), in the unit that reads best."""
    if unit == "µs":
        if v >= 1e6:
            return f"{num(v / 1e6)} s"
        if v >= 1e3:
            return f"{num(v / 1e3)} ms"
        return f"{num(v)} µs"
    if v >= 1e6:
        return f"{num(v / 1e6)} M/s"
    if v >= 1e3:
        return f"{num(v / 1e3)} k/s"
    return f"{num(v)} /s"


def panel_svg(y: float, title: str, unit: str, vals: list[tuple[str, float]]) -> tuple[list[str], float]:
    # (A bar starts at the decade under the smallest value, which is never that decade.)
    lo = math.floor(math.log10(min(v for _, v in vals)) - 0.3)
    hi = math.ceil(math.log10(max(v for _, v in vals)))
    hi = max(hi, lo + 1)

    def x(v: float) -> float:
        return LABEL + BARS * (math.log10(v) - lo) / (hi - lo)

    out = [f'<text x="10" y="{y + 14}" class="title">{escape(title)}</text>']
    top = y + 26
    bottom = top + len(vals) * (BAR_H + GAP)
    for d in range(lo, hi + 1):
        gx = LABEL + BARS * (d - lo) / (hi - lo)
        out.append(f'<line x1="{gx:.1f}" y1="{top - 4}" x2="{gx:.1f}" y2="{bottom}" class="grid"/>')
        out.append(f'<text x="{gx:.1f}" y="{bottom + 14}" class="tick">{fmt(10.0 ** d, unit)}</text>')
    base = 10.0**lo
    for i, (name, v) in enumerate(vals):
        by = top + i * (BAR_H + GAP)
        w = max(1.0, x(v) - x(base))
        colour = MIZU if is_mizu(name) else PEER
        out.append(f'<text x="{LABEL - 8}" y="{by + 13}" class="name">{escape(name)}</text>')
        out.append(f'<rect x="{LABEL}" y="{by}" width="{w:.1f}" height="{BAR_H}" fill="{colour}"/>')
        out.append(f'<text x="{LABEL + w + 6:.1f}" y="{by + 13}" class="value">{fmt(v, unit)}</text>')
    return out, bottom + 30


def chart(doc: dict) -> str:
    body: list[str] = []
    y = 40.0
    for title, unit, vals in panels(doc):
        part, y = panel_svg(y, title, unit, vals)
        body += part
    floor = doc.get("floor_ns") or []
    note = f"{doc['date']}; {doc['machine']}; {doc['workers']} workers each"
    if floor:
        note += f"; machine floor (one cache line's round trip) {min(floor):.0f}–{max(floor):.0f} ns"
    height = y + 20
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif">',
        "<style>.title{font-size:14px;font-weight:bold}.name{font-size:12px;text-anchor:end}"
        ".value{font-size:11px}.tick{font-size:10px;text-anchor:middle;fill:#555}"
        ".grid{stroke:#ddd}.note{font-size:11px;fill:#555}</style>",
        f'<rect width="{WIDTH}" height="{height:.0f}" fill="white"/>',
        f'<text x="10" y="20" class="title">{escape(doc["title"])}</text>',
        f'<text x="10" y="{height - 8:.0f}" class="note">{escape(note)}</text>',
    ]
    return "\n".join(head + body + ["</svg>"]) + "\n"


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: charts.py RESULTS.json [...]")
    for arg in sys.argv[1:]:
        src = Path(arg)
        out = src.with_suffix(".svg")
        out.write_text(chart(json.loads(src.read_text())))
        print(f"chart: {out}")


if __name__ == "__main__":
    main()
