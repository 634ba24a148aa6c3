#!/usr/bin/env python3
"""Hit rate against cache budget on a real lookup trace, from `fetchahead bench-io --trace
... --json`: each policy (LRU, ARC, W-TinyLFU, exact LFU, the store's row cache, with
look-ahead where measured) beside Belady's MIN and the top-k bound (the counted half's own k
hottest rows pinned from its start: what independent draws of that popularity would allow; it
pays no first reads, so at large budgets it passes Belady, which does). Plain Python, writes SVG.

    fetchahead bench-io DIR --trace T.u64.xz --steps T.steps.u32 --docs T.docs.json --json > run.json
    python3 docs/plots/hit_rate.py run.json docs/hit_rate_trace.svg
"""
import json
import math
import sys

W, H = 760, 470
LEFT, RIGHT, TOP, BOTTOM = 70, 200, 40, 60

SERIES = [
    # (label, colour, dash, value of a budget row or None)
    ("Belady's MIN", "#000000", "", lambda b: b.get("belady_hit_rate")),
    ("top-k pinned", "#777777", "6,4", lambda b: b.get("top_k_hit_rate")),
    ("row cache + look-ahead", "#d62728", "",
     lambda b: (b.get("lookahead") or {}).get("hit_rate")),
    ("row cache (shipped)", "#1f77b4", "", lambda b: b.get("shipped_hit_rate")),
    ("exact LFU", "#2ca02c", "4,3", lambda b: b["policies"].get("lfu-exact")),
    ("W-TinyLFU", "#9467bd", "4,3", lambda b: b["policies"].get("w-tinylfu")),
    ("ARC", "#ff7f0e", "4,3", lambda b: b["policies"].get("arc")),
    ("LRU", "#8c564b", "4,3", lambda b: b["policies"].get("lru")),
]


def main(src, dst):
    with open(src) as f:
        run = json.load(f)
    rows = sorted(run["budgets"], key=lambda b: b["cache_rows"])
    distinct = run["distinct_rows"]
    xs = [100.0 * b["cache_rows"] / distinct for b in rows]
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    values = [get(b) for b in rows for _, _, _, get in SERIES]
    ymax = max(v for v in values if v is not None)
    ymax = min(1.0, math.ceil(ymax * 10 + 0.5) / 10)

    def px(x):
        return LEFT + (math.log10(x) - lo) / (hi - lo) * (W - LEFT - RIGHT)

    def py(y):
        return TOP + (1 - y / ymax) * (H - TOP - BOTTOM)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">Hit rate against budget, '
        f'{run["trace"].split("/")[-1]} (second half counted)</text>',
    ]
    # Axes and grid.
    for i in range(int(ymax * 10) + 1):
        y = i / 10
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
                   f'stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 8}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    for b, x in zip(rows, xs):
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
                   f'stroke="#f0f0f0"/>')
        out.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">'
                   f'{x:.3g}%</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 18}" text-anchor="middle">'
               f'budget, % of the trace\'s {distinct:,} distinct rows (log scale)</text>')
    out.append(f'<text x="18" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {(TOP + H - BOTTOM) / 2})">hit rate</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" '
               f'height="{H - TOP - BOTTOM}" fill="none" stroke="#444"/>')
    # Series.
    legend_y = TOP + 10
    for label, colour, dash, get in SERIES:
        pts = [(x, get(b)) for b, x in zip(rows, xs) if get(b) is not None]
        if not pts:
            continue
        d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" '
                   f'stroke-width="2"{dash_attr}/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>')
        lx = W - RIGHT + 14
        out.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{legend_y}" y2="{legend_y}" '
                   f'stroke="{colour}" stroke-width="2"{dash_attr}/>')
        out.append(f'<text x="{lx + 30}" y="{legend_y + 4}">{label}</text>')
        legend_y += 20
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: hit_rate.py RUN.json OUT.svg")
    main(sys.argv[1], sys.argv[2])
