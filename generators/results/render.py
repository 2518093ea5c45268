"""Scaling points -> the report's files: a Markdown table, report.md and two SVG charts (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

from generators.core.markdown import cell, table
from generators.results.measurements import Point
from generators.results.svgchart import Series, line_chart

GENERATOR = "generators/report.py"


COLUMNS = (
    "series",
    "GPUs",
    "tokens/s per GPU",
    "tokens/s",
    "MFU",
    "scaling efficiency",
    "step time (s)",
    "peak memory (GiB)",
    "measurements",
    "predicted tokens/s per GPU (error)",
)


def _predicted(p: Point) -> str:
    """The speed model's figure and its error against the measurement, or - where it has none."""
    if p.predicted_tokens_per_s_per_gpu is None:
        return "-"
    predicted = p.predicted_tokens_per_s_per_gpu
    return f"{predicted:,.0f} ({predicted / p.tokens_per_s_per_gpu - 1:+.0%})"


def markdown_table(points: Sequence[Point]) -> str:
    """The report table, columns padded so it also reads as plain text."""
    rows = [
        [
            cell(p.series),
            str(p.world_size),
            f"{p.tokens_per_s_per_gpu:,.0f}",
            f"{p.tokens_per_s:,.0f}",
            f"{p.mfu:.1%}",
            f"{p.efficiency:.1%}",
            f"{p.step_time_s:.4f}",
            "-" if p.peak_mem_gib is None else f"{p.peak_mem_gib:.1f}",
            str(len(p.measurements)),
            _predicted(p),
        ]
        for p in points
    ]
    return table(COLUMNS, rows)


def _by_series(points: Sequence[Point]) -> list[list[Point]]:
    out: list[list[Point]] = []
    for p in points:
        if not out or out[-1][0].series != p.series:
            out.append([])
        out[-1].append(p)
    return out


def _tokens_tick(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:.3g}"


def _percent_tick(value: float) -> str:
    return f"{value * 100:g}%"


def scaling_svg(points: Sequence[Point]) -> str:
    """Tokens/s per GPU against GPUs; efficiency labels everywhere but at the baseline."""
    series = []
    for group in _by_series(points):
        baseline = next(p for p in group if p.world_size == p.baseline_world_size)
        series.append(
            Series(
                name=group[0].series,
                points=tuple((p.world_size, p.tokens_per_s_per_gpu) for p in group),
                labels=tuple("" if p is baseline else f"{p.efficiency:.0%}" for p in group),
                ideal=baseline.tokens_per_s_per_gpu,
            )
        )
    return line_chart(
        series,
        title="Tokens/s per GPU (labels: scaling efficiency)",
        x_label="GPUs (log2 scale)",
        y_label="tokens/s per GPU",
        y_tick=_tokens_tick,
    )


def mfu_svg(points: Sequence[Point]) -> str:
    series = [
        Series(name=group[0].series, points=tuple((p.world_size, p.mfu) for p in group)) for group in _by_series(points)
    ]
    return line_chart(
        series, title="Model FLOPs utilisation", x_label="GPUs (log2 scale)", y_label="MFU", y_tick=_percent_tick
    )


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def report_markdown(points: Sequence[Point], baseline_world_size: int | None) -> str:
    baseline = (
        f"{baseline_world_size} GPU{'s' if baseline_world_size != 1 else ''}"
        if baseline_world_size is not None
        else "its smallest world size"
    )
    lines = [
        "# Scaling report",
        "",
        f"Written by `python {GENERATOR}`. Figures are medians after warm-up. tokens/s = tokens/s per GPU x GPUs.",
        f"Scaling efficiency = tokens/s per GPU / tokens/s per GPU of the same series at {baseline}.",
        "MFU is against the GPU's dense bf16 peak (0 on CPU).",
        "",
        markdown_table(points),
        "",
        "![Tokens/s per GPU against GPUs, with ideal scaling](scaling.svg)",
        "",
        "![MFU against GPUs](mfu.svg)",
        "",
        "## Measurements",
        "",
    ]
    for p in points:
        for m in p.measurements:
            device = f" ({m.device})" if m.device else ""
            note = _code(m.command) if m.command else m.note
            lines.append(
                f"- {cell(p.series)}, {p.world_size} GPU{'s' if p.world_size != 1 else ''}: {m.source}{device}: {note}"
            )
    return "\n".join(lines) + "\n"


def render(points: Sequence[Point], baseline_world_size: int | None) -> dict[str, bytes]:
    """{file name under --out: bytes}. SVG text stays ASCII (other characters as XML references)."""
    return {
        "report.md": report_markdown(points, baseline_world_size).encode("utf-8"),
        "scaling.svg": scaling_svg(points).encode("ascii", "xmlcharrefreplace"),
        "mfu.svg": mfu_svg(points).encode("ascii", "xmlcharrefreplace"),
    }
