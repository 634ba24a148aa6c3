#!/usr/bin/env python3
"""Draws a fetchahead timeline trace (the Chrome trace JSON of `fetchahead-lab trace`, the demo's
--timeline or the decode-step bench's FETCHAHEAD_BENCH_TIMELINE) as an SVG: one panel a step
(eager and replayed side by side, on one time axis from each step's first block), a row an SM
(--rows sm) or a kernel kind (--rows kind), each block a bar colored by its kind.

Plain Python 3, no third-party packages:

    python3 docs/plots/timeline_svg.py trace.json -o docs/timeline.svg [--rows kind]
        [--steps "eager floor_plan step 1,replayed floor_plan step 1"] [--from-us 0 --to-us 400]
        [--window 3]

A reader's blocks outside any window (the shadows of the `floor_hand` steps, which warm the
readers by hand on a side branch) are drawn as "reader by hand". `--window K` draws window K of
each step in place of --from-us/--to-us: each panel's time axis starts where the window's spin
(the compute before its collective) ends, so that what delays the collective and the readers
lines up across the panels, and runs to the latest panel's last block of the window, 3 us
either side.
"""
import argparse
import json
import sys
from html import escape

COLORS = {
    "l2 prefetch": "#d62728",
    "collective": "#7f7f7f",
    "reader": "#1f77b4",
    "spin": "#c7c7c7",
    "engram gather": "#2ca02c",
    "reader by hand": "#17becf",
    "other": "#9467bd",
}
ORDER = ["collective", "l2 prefetch", "reader by hand", "reader", "spin", "engram gather", "other"]


def load(path):
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    names, spans = {}, {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "X":
            if e.get("cat") == "reader" and e.get("args", {}).get("window") is None:
                e["cat"] = "reader by hand"
            spans.setdefault(e["pid"], []).append(e)
    order = sorted(spans, key=lambda pid: pid)
    return [(names.get(pid, f"pid {pid}"), spans[pid]) for pid in order]


def draw(steps, rows, t0, t1, width):
    left, top, row_h, gap, panel_gap = 150, 40, 6 if rows == "sm" else 18, 1, 36
    plot_w = width - left - 20
    scale = plot_w / max(t1 - t0, 1e-9)
    out, y = [], top
    for name, spans in steps:
        keys = sorted({s["tid"] for s in spans}) if rows == "sm" else [
            k for k in ORDER if any(s.get("cat", "other") == k for s in spans)
        ]
        index = {k: i for i, k in enumerate(keys)}
        out.append(f'<text x="{left}" y="{y - 8}" font-weight="bold">{escape(name)}</text>')
        height = len(keys) * (row_h + gap)
        out.append(
            f'<rect x="{left}" y="{y}" width="{plot_w}" height="{height}" fill="none" '
            f'stroke="#ddd"/>'
        )
        if rows == "kind" or len(keys) <= 40:
            for k, i in index.items():
                label = f"SM {k}" if rows == "sm" else k
                out.append(
                    f'<text x="{left - 6}" y="{y + i * (row_h + gap) + row_h - 1}" '
                    f'text-anchor="end" font-size="{min(row_h, 11)}">{escape(label)}</text>'
                )
        for s in spans:
            start, end = s["ts"], s["ts"] + s["dur"]
            if end < t0 or start > t1:
                continue
            key = s["tid"] if rows == "sm" else s.get("cat", "other")
            x = left + (max(start, t0) - t0) * scale
            w = max((min(end, t1) - max(start, t0)) * scale, 0.5)
            color = COLORS.get(s.get("cat", "other"), COLORS["other"])
            title = escape(f'{s["name"]} block {s["args"].get("block")}: {start:.2f}-{end:.2f} us')
            out.append(
                f'<rect x="{x:.2f}" y="{y + index[key] * (row_h + gap)}" width="{w:.2f}" '
                f'height="{row_h}" fill="{color}" fill-opacity="0.75"><title>{title}</title></rect>'
            )
        y += height + panel_gap
    # The time axis under the last panel, ten ticks.
    for i in range(11):
        t = t0 + (t1 - t0) * i / 10
        x = left + (t - t0) * scale
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y - panel_gap}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{y - panel_gap + 14}" text-anchor="middle" font-size="10">{t:.0f} us</text>')
    legend_x = left
    for kind in ORDER:
        out.append(f'<rect x="{legend_x}" y="{y}" width="10" height="10" fill="{COLORS[kind]}"/>')
        out.append(f'<text x="{legend_x + 14}" y="{y + 9}" font-size="11">{kind}</text>')
        legend_x += 110
    total_h = y + 30
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" '
        f'font-family="sans-serif" font-size="12">'
        f'<rect width="100%" height="100%" fill="white"/>'
    )
    return head + "".join(out) + "</svg>\n"


def window_of(steps, k):
    """Each step's blocks shifted so that window `k`'s spin ends at 0 (its first other block
    starts there where it has no spin), and the end of the latest step's window + 3 us."""
    shifted, end = [], 0.0
    for name, spans in steps:
        window = [s for s in spans if s.get("args", {}).get("window") == k]
        inside = [s for s in window if s.get("cat") != "spin"]
        if not inside:
            sys.exit(f"{name} has no block of window {k}")
        spin = [s["ts"] + s["dur"] for s in window if s.get("cat") == "spin"]
        zero = max(spin) if spin else min(s["ts"] for s in inside)
        end = max(end, max(s["ts"] + s["dur"] for s in inside) - zero)
        shifted.append((name, [dict(s, ts=s["ts"] - zero) for s in spans]))
    return shifted, end + 3.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--rows", choices=["sm", "kind"], default="kind")
    p.add_argument("--steps", help="comma-separated step names (default: all)")
    p.add_argument("--from-us", type=float, default=0.0)
    p.add_argument("--to-us", type=float, help="default: the longest step's end")
    p.add_argument("--width", type=int, default=1600)
    p.add_argument("--window", type=int, help="draw this window of the first step drawn")
    a = p.parse_args(argv)
    steps = load(a.trace)
    if a.steps:
        wanted = [s.strip() for s in a.steps.split(",")]
        by_name = dict(steps)
        missing = [w for w in wanted if w not in by_name]
        if missing:
            sys.exit(f"no step named {missing}; the trace has {[n for n, _ in steps]}")
        steps = [(w, by_name[w]) for w in wanted]
    if not steps:
        sys.exit(f"{a.trace}: no blocks recorded")
    t0 = a.from_us
    t1 = a.to_us if a.to_us is not None else max(s["ts"] + s["dur"] for _, ss in steps for s in ss)
    if a.window is not None:
        steps, t1 = window_of(steps, a.window)
        t0 = -3.0
    svg = draw(steps, a.rows, t0, t1, a.width)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
