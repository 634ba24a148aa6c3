"""The pure part of ``peers.py``: the issue's goals, the peer's validity window, the byte
counts and the report table, with no torch or Triton (``python/tests/test_peers_report.py``
tests it on a machine without a GPU).

A measurement is a dict ``{"us": median microseconds per call, ...}``; a size's results are

    {"default": m, "best": (name, m), "variants": {name: m}, "triton": m, "ceiling": m}

(``ceiling`` for the dequant only), per table and family.
"""
from __future__ import annotations

from typing import Any, Optional

DIM = 256
SCALES = DIM // 32
SIZES = (72, 4096, 65536, 1 << 20, 4 << 20)
TABLES = ("quantized", "random", "low_entropy")

# The H200 figures for the peers (issue 24): a peer counts only within 3% of them.
PEER_FIGURES_US = {
    ("gather_dequant", 4 << 20): (903.0, 914.0),
    ("gather_dequant", 1 << 20): (240.0, 242.0),
    ("gather", 4 << 20): (539.0, 543.0),
}
PEER_TOLERANCE = 0.03


def bytes_moved(family: str, n: int) -> int:
    """Bytes one call reads and writes: the ids, the rows (and their scales), the output."""
    if family == "gather_dequant":
        return n * (8 + DIM + SCALES + 2 * DIM)
    return n * (8 + DIM + DIM)


def copy_ratio(family: str, n: int, us: float, copy_bytes_per_s: float) -> float:
    """The call's bytes per second over the device-to-device copy's (read + write)."""
    return bytes_moved(family, n) / (us * 1e-6) / copy_bytes_per_s


def size_label(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    return str(n)


def _met(ok: Optional[bool]) -> str:
    return "n/a" if ok is None else ("MET" if ok else "NOT MET")


def goals(results: dict[str, dict[str, dict[int, dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Each goal of the issue checked on ``results[table][family][n]``: a row per goal, table
    and size, ``{"item", "goal", "table", "family", "n", "value", "met"}``. ``value`` is the
    ratio the goal bounds (>= 1 meets it unless the goal says otherwise)."""
    rows = []

    def row(item, goal, table, family, n, value, met):
        rows.append(
            {"item": item, "goal": goal, "table": table, "family": family, "n": n,
             "value": value, "met": met}
        )

    for table, families in results.items():
        dq = families.get("gather_dequant", {})
        g = families.get("gather", {})
        for n, r in sorted(dq.items()):
            if n < 1 << 20 or "default" not in r:
                continue
            d = r["default"]["us"]
            if "ceiling" in r:
                v = r["ceiling"]["us"] / d
                row(2, "default >= 1.00 x ceiling", table, "gather_dequant", n, v, v >= 1.0)
            if "triton" in r:
                v = r["triton"]["us"] / d
                row(2, "default >= 1.03 x Triton", table, "gather_dequant", n, v, v >= 1.03)
        r = g.get(4 << 20)
        if r and "default" in r and "triton" in r:
            v = r["triton"]["us"] / r["default"]["us"]
            row(3, "gather default >= 1.00 x Triton", table, "gather", 4 << 20, v, v >= 1.0)
        for family, sizes in (("gather_dequant", dq), ("gather", g)):
            for n in (72, 4096):
                r = sizes.get(n)
                if r and "default" in r and "triton" in r:
                    v = r["triton"]["us"] / r["default"]["us"]
                    row(4, "per call <= Triton's", table, family, n, v, v >= 1.0)
            for n, r in sorted(sizes.items()):
                if "default" in r and "best" in r:
                    v = r["default"]["us"] / r["best"][1]["us"]
                    row(5, "default within 2% of the best variant", table, family, n, v,
                        v <= 1.02)
    return rows


# Variants whose slowest-table time is within this factor of the fastest's tie as a size's
# winners: a default must be within 2% of the best variant (issue 24, item 5).
WINNER_TIE = 1.02
# The record's family names (tests/defaults.rs reads them).
RECORD_FAMILY = {"gather": "gather", "gather_dequant": "dequant"}


def winner_lines(results: dict[str, dict[str, dict[int, dict[str, Any]]]], arch: str) -> list[str]:
    """``benches/recorded/winners.txt``'s lines: per family and size, ``arch family n names...``,
    the variants whose slowest time over the tables measured (a variant measured on every one)
    is within ``WINNER_TIE`` of the smallest, fastest first."""
    lines = []
    families = sorted({f for fams in results.values() for f in fams}, key=list(RECORD_FAMILY).index)
    for family in families:
        sizes = sorted({n for fams in results.values() for n in fams.get(family, {})})
        for n in sizes:
            per_table = [fams[family][n].get("variants", {}) for fams in results.values()
                         if n in fams.get(family, {})]
            names = set.intersection(*(set(v) for v in per_table)) if per_table else set()
            worst = sorted((max(v[name]["us"] for v in per_table), name) for name in names)
            if not worst:
                continue
            best = worst[0][0]
            tied = [name for us, name in worst if us <= best * WINNER_TIE]
            lines.append(f"{arch} {RECORD_FAMILY[family]} {n} {' '.join(tied)}")
    return lines


def peer_validity(results: dict[str, dict[str, dict[int, dict[str, Any]]]]) -> list[dict[str, Any]]:
    """The Triton peers against the issue's H200 figures, within 3%: a row per figure and table,
    ``{"family", "n", "table", "us", "window", "valid"}``."""
    rows = []
    for table, families in results.items():
        for (family, n), (lo, hi) in PEER_FIGURES_US.items():
            r = families.get(family, {}).get(n)
            if not r or "triton" not in r:
                continue
            window = (lo * (1 - PEER_TOLERANCE), hi * (1 + PEER_TOLERANCE))
            us = r["triton"]["us"]
            rows.append({"family": family, "n": n, "table": table, "us": us,
                         "window": window, "valid": window[0] <= us <= window[1]})
    return rows


def markdown(
    results: dict[str, dict[str, dict[int, dict[str, Any]]]],
    copy_bytes_per_s: float,
    heading: str,
) -> str:
    """BENCHMARKS.md's kernel rows from one run: per family, table and size fetchahead's
    default, its best variant, the Triton peer and the movement ceiling (us and x copy), and
    the issue's goals for that row, MET or NOT MET. ``heading`` names the date, device, commit
    and command."""
    by_row: dict[tuple[str, str, int], list[str]] = {}
    for g in goals(results):
        by_row.setdefault((g["table"], g["family"], g["n"]), []).append(
            f"{g['item']} ({g['goal']}): {g['value']:.3f} {_met(g['met'])}")

    def cell(family, n, m):
        if m is None:
            return "-"
        return f"{m['us']:.1f} us ({copy_ratio(family, n, m['us'], copy_bytes_per_s):.3f})"

    out = [heading, "",
           "| kernel | table | n | fetchahead default | best variant | Triton peer | "
           "ceiling (same bytes, no arithmetic) | goals (issue 24: item: ratio) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for table, families in results.items():
        for family, sizes in families.items():
            for n, r in sorted(sizes.items()):
                best = r.get("best")
                best_cell = f"`{best[0]}` {cell(family, n, best[1])}" if best else "-"
                out.append(
                    f"| {family} | {table} | {size_label(n)} | {cell(family, n, r.get('default'))} "
                    f"| {best_cell} | {cell(family, n, r.get('triton'))} "
                    f"| {cell(family, n, r.get('ceiling'))} "
                    f"| {'; '.join(by_row.get((table, family, n), [])) or '-'} |")
    return "\n".join(out) + "\n"


def report_lines(
    results: dict[str, dict[str, dict[int, dict[str, Any]]]],
    copy_bytes_per_s: float,
    empty_us: Optional[float],
    is_h200: bool,
) -> list[str]:
    """The printed report: per table, family and size the default, the best variant, the
    Triton peer, the ceiling (each in us and x copy); then the goals and the peer check."""
    out = [f"copy: {copy_bytes_per_s / 1e9:.1f} GB/s (read + write, torch device-to-device)"]
    if empty_us is not None:
        out.append(f"empty Triton kernel replayed from a graph: {empty_us:.2f} us per call")

    def cell(family, n, m):
        if m is None:
            return "-"
        return f"{m['us']:.1f} us ({copy_ratio(family, n, m['us'], copy_bytes_per_s):.3f})"

    for table, families in results.items():
        for family, sizes in families.items():
            out.append("")
            out.append(f"== {family}, {table} table (us per call, x copy in parentheses)")
            out.append(f"{'n':>6} | {'default':>22} | {'best variant':>52} | "
                       f"{'Triton':>22} | {'ceiling':>22}")
            for n, r in sorted(sizes.items()):
                best = r.get("best")
                best_cell = f"{best[0]} {cell(family, n, best[1])}" if best else "-"
                tri = r.get("triton")
                tri_cell = cell(family, n, tri)
                if tri and tri.get("config"):
                    tri_cell += f" {tri['config']}"
                out.append(
                    f"{size_label(n):>6} | {cell(family, n, r.get('default')):>22} | "
                    f"{best_cell:>52} | {tri_cell:>22} | {cell(family, n, r.get('ceiling')):>22}"
                )
    out.append("")
    out.append("== goals (issue 24)")
    for g in goals(results):
        out.append(f"item {g['item']}: {g['goal']:<40} {g['family']:<15} {g['table']:<12} "
                   f"n={size_label(g['n']):>5}: {g['value']:.3f} {_met(g['met'])}")
    checks = peer_validity(results)
    if is_h200 and checks:
        out.append("")
        out.append("== peer is valid (the issue's H200 figures, within 3%)")
        for c in checks:
            lo, hi = c["window"]
            out.append(f"Triton {c['family']:<15} n={size_label(c['n']):>3} {c['table']:<12}: "
                       f"{c['us']:.1f} us in {lo:.1f}..{hi:.1f}: "
                       f"{'VALID' if c['valid'] else 'NOT VALID'}")
    elif checks:
        out.append("")
        out.append("(not an H200: the peer's figures are not checked against the issue's)")
    return out
