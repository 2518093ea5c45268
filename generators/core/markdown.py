"""Markdown tables that read as plain text too (padded columns): the report's and the plan's."""

from __future__ import annotations

from collections.abc import Sequence


def cell(text: str) -> str:
    """A table cell: a `|` in the text would end it."""
    return text.replace("|", "\\|")


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Header, rule and rows; the first `left` columns left-aligned, every other right-aligned."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    rule = "|" + "|".join("-" * (w + 2) if i < left else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule] + [line(r) for r in rows])
