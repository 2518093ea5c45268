"""Scaling charts as plain SVG text: GPUs on a log2 x axis, a figure per GPU on a linear y axis.

No plotting library: the chart is a few dozen SVG elements written by this module, so the same
series give the same bytes on every machine (coordinates rounded to 0.1 px, every number formatted
here, series drawn in the order given). Each series is one `<g class="series">` holding exactly one
`<polyline>` through its points, a circle per point, optionally a dashed ideal-scaling `<line>` and a
text label per point; a legend on the right names the series in the same colours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

# Tableau 10: distinguishable colours that also survive greyscale printing reasonably. Past ten
# series the colours repeat with another dash pattern, so no two series look the same.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
DASHES = ("", "6 3", "2 2", "8 3 2 3")

PLOT_W, PLOT_H = 560, 320
LEFT, TOP, BOTTOM = 80, 48, 56
LEGEND_GAP, LEGEND_ROW, CHAR_W = 24, 18, 7  # CHAR_W: a generous average glyph width at 12 px
LABEL_GAP = 13  # px between point labels at one x
NUM_Y_TICKS = 5


@dataclass(frozen=True)
class Series:
    """One line of a chart."""

    name: str
    points: tuple[tuple[int, float], ...]  # (GPUs, value), ascending GPUs, at least one
    labels: tuple[str, ...] = ()  # text drawn above each point ("" for none); empty: no labels
    ideal: float | None = None  # value of perfect scaling, drawn across the series' GPU range


def _f(value: float) -> str:
    """A coordinate: 0.1 px is finer than any screen and keeps the bytes stable."""
    text = f"{value:.1f}"
    return "0.0" if text == "-0.0" else text


def _style(index: int) -> tuple[str, str, str]:
    """(colour, dash attribute, marker fill) of the index-th series. Past the first ten the colours
    repeat with a dash pattern and hollow markers (a lone point has no line to show its dash)."""
    colour = PALETTE[index % len(PALETTE)]
    dash = DASHES[(index // len(PALETTE)) % len(DASHES)]
    return colour, f' stroke-dasharray="{dash}"' if dash else "", colour if index < len(PALETTE) else "#ffffff"


def nice_ticks(top: float) -> list[float]:
    """0, step, 2*step, ... covering `top` with about NUM_Y_TICKS steps of 1, 2, 2.5 or 5 x 10^k."""
    if not top > 0:
        top = 1.0
    raw = top / NUM_Y_TICKS
    magnitude = 1.0
    while magnitude * 10 <= raw:
        magnitude *= 10
    while magnitude > raw:
        magnitude /= 10
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if raw <= m * magnitude)
    count = math.ceil(top / step - 1e-9)
    return [i * step for i in range(count + 1)]


def line_chart(
    series: Sequence[Series], *, title: str, x_label: str, y_label: str, y_tick: Callable[[float], str]
) -> str:
    """The SVG document (text) for `series`; y_tick formats a y value for the axis."""
    if not series:
        raise ValueError("a chart needs at least one series")
    gpus = sorted({x for s in series for x, _ in s.points})
    lo, hi = math.log2(gpus[0]), math.log2(gpus[-1])
    pad = 0.5 if hi == lo else (hi - lo) * 0.08
    x0, x1 = lo - pad, hi + pad
    values = [v for s in series for _, v in s.points] + [s.ideal for s in series if s.ideal is not None]
    ticks = nice_ticks(max(values) * 1.08)
    y_top = ticks[-1]

    def px(gpu: int) -> float:
        return LEFT + (math.log2(gpu) - x0) / (x1 - x0) * PLOT_W

    def py(value: float) -> float:
        return TOP + PLOT_H - value / y_top * PLOT_H

    legend_x = LEFT + PLOT_W + LEGEND_GAP
    legend_w = 36 + CHAR_W * max([len(s.name) for s in series] + [len("ideal scaling")])
    width = legend_x + legend_w + 8
    height = max(TOP + PLOT_H + BOTTOM, TOP + LEGEND_ROW * (len(series) + 2))
    bottom = TOP + PLOT_H
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{_f(LEFT + PLOT_W / 2)}" y="24" text-anchor="middle" font-size="15">{escape(title)}</text>',
        '<g class="grid" stroke="#dddddd" stroke-width="1">',
    ]
    for value in ticks[1:]:
        out.append(f'<line x1="{LEFT}" y1="{_f(py(value))}" x2="{LEFT + PLOT_W}" y2="{_f(py(value))}"/>')
    out.append("</g>")
    out.append('<g class="axes" stroke="#333333" stroke-width="1">')
    out.append(f'<line x1="{LEFT}" y1="{bottom}" x2="{LEFT + PLOT_W}" y2="{bottom}"/>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}"/>')
    for gpu in gpus:
        out.append(f'<line x1="{_f(px(gpu))}" y1="{bottom}" x2="{_f(px(gpu))}" y2="{bottom + 5}"/>')
    for value in ticks:
        out.append(f'<line x1="{LEFT - 5}" y1="{_f(py(value))}" x2="{LEFT}" y2="{_f(py(value))}"/>')
    out.append("</g>")
    out.append('<g class="ticks" fill="#333333">')
    for gpu in gpus:
        out.append(f'<text x="{_f(px(gpu))}" y="{bottom + 19}" text-anchor="middle">{gpu}</text>')
    for value in ticks:
        out.append(f'<text x="{LEFT - 8}" y="{_f(py(value) + 4)}" text-anchor="end">{escape(y_tick(value))}</text>')
    out.append("</g>")
    out.append(f'<text x="{_f(LEFT + PLOT_W / 2)}" y="{bottom + 42}" text-anchor="middle">{escape(x_label)}</text>')
    mid = _f(TOP + PLOT_H / 2)
    out.append(f'<text x="18" y="{mid}" text-anchor="middle" transform="rotate(-90 18 {mid})">{escape(y_label)}</text>')

    # Labels at one x sit at least a line apart (top to bottom in value order), so close series
    # keep readable labels.
    label_y: dict[tuple[int, int], float] = {}
    for gpu in gpus:
        wanted = sorted(
            (py(v) - 7, i, j)
            for i, s in enumerate(series)
            for j, ((x, v), label) in enumerate(zip(s.points, s.labels, strict=False))  # labels may be ()
            if x == gpu and label
        )
        floor = -math.inf
        for y, i, j in wanted:
            label_y[(i, j)] = floor = max(y, floor + LABEL_GAP)

    for index, s in enumerate(series):
        colour, dash_attr, marker_fill = _style(index)
        out.append(f'<g class="series" data-series={quoteattr(s.name)} stroke={quoteattr(colour)}>')
        xs = [x for x, _ in s.points]
        if s.ideal is not None and xs[0] != xs[-1]:
            # Perfect scaling keeps the per-GPU figure flat: a dashed line at the baseline value.
            out.append(
                f'<line class="ideal" x1="{_f(px(xs[0]))}" y1="{_f(py(s.ideal))}" x2="{_f(px(xs[-1]))}" '
                f'y2="{_f(py(s.ideal))}" stroke-width="1" stroke-dasharray="3 4" opacity="0.7"/>'
            )
        coords = " ".join(f"{_f(px(x))},{_f(py(v))}" for x, v in s.points)
        out.append(f'<polyline class="measured" points="{coords}" fill="none" stroke-width="2"{dash_attr}/>')
        for x, v in s.points:
            out.append(f'<circle cx="{_f(px(x))}" cy="{_f(py(v))}" r="3.5" fill={quoteattr(marker_fill)}/>')
        for j, ((x, _), label) in enumerate(zip(s.points, s.labels, strict=False)):  # labels may be ()
            if label:
                out.append(
                    f'<text x="{_f(px(x) + 6)}" y="{_f(label_y[(index, j)])}" fill={quoteattr(colour)} '
                    f'stroke="none">{escape(label)}</text>'
                )
        out.append("</g>")

    out.append('<g class="legend">')
    for index, s in enumerate(series):
        colour, dash_attr, marker_fill = _style(index)
        y = TOP + LEGEND_ROW * index + 6
        out.append(
            f'<line x1="{legend_x}" y1="{y}" x2="{legend_x + 24}" y2="{y}" stroke={quoteattr(colour)} '
            f'stroke-width="2"{dash_attr}/>'
        )
        out.append(
            f'<circle cx="{legend_x + 12}" cy="{y}" r="3.5" fill={quoteattr(marker_fill)} stroke={quoteattr(colour)}/>'
        )
        out.append(f'<text x="{legend_x + 30}" y="{y + 4}">{escape(s.name)}</text>')
    if any(s.ideal is not None and s.points[0][0] != s.points[-1][0] for s in series):
        y = TOP + LEGEND_ROW * len(series) + 6
        out.append(
            f'<line x1="{legend_x}" y1="{y}" x2="{legend_x + 24}" y2="{y}" stroke="#333333" '
            'stroke-width="1" stroke-dasharray="3 4"/>'
        )
        out.append(f'<text x="{legend_x + 30}" y="{y + 4}">ideal scaling</text>')
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
