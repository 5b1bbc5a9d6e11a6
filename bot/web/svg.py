"""Server-side SVG line plots (hand-written: a few dozen lines beat a charting dependency here).

Every point is an <a> around a <circle class="point">, so a plot reads and links without JavaScript;
its <title> is the browser's tooltip. Text is escaped; numbers are formatted by the caller.
"""
from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup, escape


@dataclass
class Point:
    label: str  # x tick (a short SHA)
    y: float
    href: str | None
    title: str


def _tick(v: float, span: float) -> str:
    """Plain numbers with as many decimals as the axis' span needs (no 1.2e+04 on a tok/s axis)."""
    digits = 0 if span >= 20 else 1 if span >= 2 else 2 if span >= 0.2 else 3
    return f"{v:,.{digits}f}"


def line_plot(points: list[Point], *, y_label: str, width: int = 720, height: int = 240,
              marks: list[int] | None = None, css_class: str = "plot") -> Markup:
    """One series over commits; `marks` are point indices drawn as dashed verticals (change points)."""
    if not points:
        return Markup(f'<p class="empty">No measured points yet for {escape(y_label)}.</p>')
    left, right, top, bottom = 72, 40, 24, 36
    w, h = width - left - right, height - top - bottom
    ys = [p.y for p in points]
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    n = len(points)

    def x(i: int) -> float:
        return left + (w * i / (n - 1) if n > 1 else w / 2)

    def y(v: float) -> float:
        return top + h * (1 - (v - lo) / (hi - lo))

    out = [f'<svg class="{escape(css_class)}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{escape(y_label)}">',
           f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>']
    for k in range(5):  # y grid and ticks
        v = lo + (hi - lo) * k / 4
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="11">{_tick(v, hi - lo)}</text>')
    out.append(f'<text x="{left}" y="{top - 8}" font-size="12" fill="#555">{escape(y_label)}</text>')
    for i in marks or []:
        if 0 < i < n:
            xm = (x(i - 1) + x(i)) / 2
            out.append(f'<line class="change-point" x1="{xm:.1f}" x2="{xm:.1f}" y1="{top}" y2="{top + h}" '
                       f'stroke="#c0392b" stroke-dasharray="4 3"/>')
    path = " ".join(f"{'M' if i == 0 else 'L'}{x(i):.1f},{y(p.y):.1f}" for i, p in enumerate(points))
    out.append(f'<path d="{path}" fill="none" stroke="#2c6fbb" stroke-width="1.5"/>')
    step = max(1, n // 10)
    for i, p in enumerate(points):
        dot = (f'<circle class="point" cx="{x(i):.1f}" cy="{y(p.y):.1f}" r="4" fill="#2c6fbb" '
               f'data-y="{p.y!r}"><title>{escape(p.title)}</title></circle>')
        out.append(f'<a href="{escape(p.href)}">{dot}</a>' if p.href else dot)
        if i % step == 0 or i == n - 1:
            anchor = "end" if i == n - 1 and n > 1 else "start" if i == 0 and n > 1 else "middle"
            out.append(f'<text x="{x(i):.1f}" y="{top + h + 16}" text-anchor="{anchor}" font-size="10" '
                       f'font-family="monospace">{escape(p.label)}</text>')
    out.append("</svg>")
    return Markup("".join(out))
