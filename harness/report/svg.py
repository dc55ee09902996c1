"""Inline SVG charts (no JS, no network): fp-vs-quant scatter with y=x, error histogram, trend,
ranked horizontal bars.

Only numbers reach the SVG markup; every label passes through html.escape."""

from __future__ import annotations

import html
import math

W, H, PAD = 320, 240, 34


def _scale(lo: float, hi: float, a: float, b: float):
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def _axes(x0: float, x1: float, y0: float, y1: float, xlabel: str, ylabel: str) -> list[str]:
    return [
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 6}" y2="{H - PAD}" stroke="#888"/>',
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{PAD}" y2="6" stroke="#888"/>',
        f'<text x="{PAD}" y="{H - PAD + 14}" font-size="10">{x0:.3g}</text>',
        f'<text x="{W - 40}" y="{H - PAD + 14}" font-size="10">{x1:.3g}</text>',
        f'<text x="2" y="{H - PAD}" font-size="10">{y0:.3g}</text>',
        f'<text x="2" y="14" font-size="10">{y1:.3g}</text>',
        f'<text x="{W / 2 - 30}" y="{H - 4}" font-size="11">{html.escape(xlabel)}</text>',
        f'<text x="{PAD + 4}" y="14" font-size="11">{html.escape(ylabel)}</text>',
    ]


def _svg(body: list[str], label: str, css_class: str) -> str:
    return (
        f'<svg class="{css_class}" role="img" aria-label="{html.escape(label)}" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>"
    )


def scatter(points: list[list[float]], label: str = "fp vs quant") -> str:
    pts = [(float(x), float(y)) for x, y in points if math.isfinite(float(x)) and math.isfinite(float(y))]
    if not pts:
        return ""
    lo = min(min(x, y) for x, y in pts)
    hi = max(max(x, y) for x, y in pts)
    sx, sy = _scale(lo, hi, PAD, W - 6), _scale(lo, hi, H - PAD, 6)
    body = _axes(lo, hi, lo, hi, "reference (fp)", "quantized")
    body.append(
        f'<line class="identity" x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" '
        'stroke="#d33" stroke-dasharray="4 3"/>'
    )
    body += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="1.8" fill="#2a6fdb" fill-opacity="0.6"/>' for x, y in pts]
    return _svg(body, label, "scatter")


def histogram(edges: list[float], counts: list[int], label: str = "error histogram") -> str:
    if not counts:
        return ""
    top = max(counts) or 1
    sx = _scale(edges[0], edges[-1], PAD, W - 6)
    sy = _scale(0, top, H - PAD, 6)
    body = _axes(edges[0], edges[-1], 0, top, "quant - fp", "count")
    for i, c in enumerate(counts):
        x0, x1 = sx(edges[i]), sx(edges[i + 1])
        body.append(
            f'<rect x="{x0:.1f}" y="{sy(c):.1f}" width="{max(x1 - x0 - 1, 1):.1f}" '
            f'height="{(H - PAD) - sy(c):.1f}" fill="#5a9"/>'
        )
    return _svg(body, label, "histogram")


def trend(values: list[float | None], flagged: bool = False, label: str = "trend") -> str:
    pts = [(i, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(float(v))]
    if not pts:
        return ""
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    sx = _scale(0, max(len(values) - 1, 1), PAD, W - 6)
    sy = _scale(lo, hi, H - PAD, 6)
    body = _axes(0, len(values) - 1, lo, hi, "run", "value")
    path = " ".join(f"{'M' if k == 0 else 'L'}{sx(i):.1f},{sy(v):.1f}" for k, (i, v) in enumerate(pts))
    color = "#d33" if flagged else "#2a6fdb"
    body.append(f'<path class="trendline" d="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    body += [f'<circle cx="{sx(i):.1f}" cy="{sy(v):.1f}" r="2.5" fill="{color}"/>' for i, v in pts]
    return _svg(body, label, "trend")


def bars(items: list[list], label: str = "ranked bars", unit: str = "dB") -> str:
    """Horizontal bars, one per (label, value), in the order given (e.g. ranked site gains);
    a non-finite or missing value is left out, a negative one drawn as zero length."""
    rows = [(str(name), float(v)) for name, v in (items or []) if v is not None and math.isfinite(float(v))]
    if not rows:
        return ""
    row_h, left, width = 16, 150, W
    height = row_h * len(rows) + 20
    top = max(max(v for _, v in rows), 0.0) or 1.0
    sx = _scale(0.0, top, left, width - 44)
    body = [f'<line x1="{left}" y1="4" x2="{left}" y2="{height - 14}" stroke="#888"/>']
    for i, (name, v) in enumerate(rows):
        y = 4 + i * row_h
        short = name if len(name) <= 26 else "\u2026" + name[-25:]
        body.append(f'<text x="{left - 4}" y="{y + 11}" font-size="9" text-anchor="end">{html.escape(short)}</text>')
        body.append(
            f'<rect x="{left}" y="{y + 2}" width="{max(sx(max(v, 0.0)) - left, 0.5):.1f}" height="{row_h - 4}" '
            f'fill="#2a6fdb"><title>{html.escape(name)}: {v:.3g} {html.escape(unit)}</title></rect>'
        )
        body.append(f'<text x="{sx(max(v, 0.0)) + 3:.1f}" y="{y + 11}" font-size="9">{v:.3g}</text>')
    body.append(f'<text x="{left}" y="{height - 2}" font-size="10">{html.escape(label)} ({html.escape(unit)})</text>')
    return (
        f'<svg class="bars" role="img" aria-label="{html.escape(label)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>"
    )


def sparkline(values: list[float | None], flagged: bool = False, width: int = 100, height: int = 16) -> str:
    """A tiny trend: the last ``width - 2`` runs, one pixel column each, integer coordinates in
    relative steps, runs of equal height as one horizontal segment, a gap where a run has no
    value, the last point marked. Size and colours come from the page's CSS (``svg.spark``; the
    ``flagged`` class draws it red)."""
    values = values[-(width - 2) :]
    pts = [(i, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(float(v))]
    if not pts:
        return ""
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    sy = (lambda v: round((hi - v) / (hi - lo) * (height - 4)) + 2) if hi > lo else (lambda v: height // 2)
    parts: list[str] = []
    prev_i = prev_y = None
    flat = 0  # pixels of a horizontal stretch not yet drawn
    for i, v in pts:
        x, y = i + 1, sy(v)
        if prev_i is not None and i == prev_i + 1 and y == prev_y:
            flat += 1
        else:
            if flat:
                parts.append(f"h{flat}")
                flat = 0
            if prev_i is None or i != prev_i + 1:
                parts.append(f"M{x} {y}")
            else:
                dy = y - prev_y
                parts.append(f"l1 {dy}" if dy >= 0 else f"l1{dy}")
        prev_i, prev_y = i, y
    if flat:
        parts.append(f"h{flat}")
    x, y = pts[-1][0] + 1, sy(pts[-1][1])
    cls = "spark flagged" if flagged else "spark"
    return f'<svg class="{cls}"><path class="trendline" d="{"".join(parts)}"/><circle cx="{x}" cy="{y}" r="1.5"/></svg>'
