"""Line charts drawn with braille characters, several coloured series on one shared scale.

Textual's `Sparkline` scales each series on its own, which hides the one thing a loss chart of a
swarm must show: whether the islands agree. This draws every series into one grid of braille
cells (2 x 4 dots per character), over shared x (time) and y ranges, joining successive points so
that a line stays a line. It returns rich `Text` lines and knows nothing about widgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rich.text import Text

_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
"""Braille dot bit for (row within cell 0-3, column within cell 0-1)."""
PALETTE = ("dodger_blue1", "dark_orange", "green3", "magenta", "gold1", "cyan", "red1", "medium_purple1")
"""Colours given to islands in the order they were first seen (the table's id column uses them too)."""


@dataclass(frozen=True)
class Series:
    points: Sequence[tuple[float, float]]
    """(x, y) pairs in x order."""
    style: str


def bounds(series: Sequence[Series], floor: float | None = None) -> tuple[float, float, float, float] | None:
    """(x0, x1, y0, y1) covering every point (y0 at most `floor` when given); None without points."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    if not xs:
        return None
    y0 = min(ys) if floor is None else min(floor, min(ys))
    y1 = max(ys)
    if y1 - y0 < 1e-9:  # a flat line: in the middle of the chart, or on the floor when there is one
        pad = abs(y1) * 0.05 or 1.0
        y0, y1 = (y0 if floor is not None else y0 - pad), y1 + pad
    return min(xs), max(xs), y0, y1


def plot(series: Sequence[Series], width: int, height: int,
         box: tuple[float, float, float, float] | None = None) -> list[Text]:
    """`height` lines of `width` braille cells; later series draw over earlier ones where they cross."""
    width, height = max(1, width), max(1, height)
    box = box or bounds(series)
    cells = [[0] * width for _ in range(height)]
    styles: list[list[str | None]] = [[None] * width for _ in range(height)]
    if box is not None:
        x0, x1, y0, y1 = box
        dots_x, dots_y = 2 * width, 4 * height

        def to_dot(x: float, y: float) -> tuple[int, int]:
            fx = 0.0 if x1 <= x0 else (x - x0) / (x1 - x0)
            fy = (y - y0) / (y1 - y0) if y1 > y0 else 0.5
            px = min(dots_x - 1, max(0, round(fx * (dots_x - 1))))
            py = min(dots_y - 1, max(0, round((1.0 - fy) * (dots_y - 1))))
            return px, py

        for s in series:
            prev: tuple[int, int] | None = None
            for x, y in s.points:
                px, py = to_dot(x, y)
                if prev is None or px <= prev[0]:  # first point, or same column: a vertical run
                    lo, hi = sorted((py, py if prev is None else prev[1]))
                    for qy in range(lo, hi + 1):
                        _set(cells, styles, px, qy, s.style)
                else:  # walk the columns to the new point, joining each to the last
                    ax, ay = prev
                    last = ay
                    for qx in range(ax + 1, px + 1):
                        qy = round(ay + (py - ay) * (qx - ax) / (px - ax))
                        lo, hi = sorted((last, qy))
                        for ry in range(lo, hi + 1):
                            _set(cells, styles, qx, ry, s.style)
                        last = qy
                prev = (px, py)
    lines = []
    for row, row_styles in zip(cells, styles):
        line = Text()
        for bits, style in zip(row, row_styles):
            line.append(chr(0x2800 + bits) if bits else " ", style or "")
        lines.append(line)
    return lines


def _set(cells: list[list[int]], styles: list[list[str | None]], px: int, py: int, style: str) -> None:
    cx, cy = px // 2, py // 4
    cells[cy][cx] |= _DOTS[py % 4][px % 2]
    styles[cy][cx] = style


def with_axis(lines: list[Text], top: str, bottom: str, label_width: int) -> list[Text]:
    """Prefix the plot with a y axis: `top` on the first line, `bottom` on the last."""
    out = []
    for i, line in enumerate(lines):
        label = top if i == 0 else bottom if i == len(lines) - 1 else ""
        out.append(Text(label.rjust(label_width) + " ", style="dim") + Text("│", style="dim") + line)
    return out
