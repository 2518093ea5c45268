"""Scaling report: a Markdown table and SVG charts from benchmark results and trainer runs.

    python generators/report.py benchmarks/results/*.jsonl
    python generators/report.py out/g1 out/g2 out/g4 out/g8 --out report/
    python generators/report.py out/*/metrics.jsonl --baseline-world-size 1 --warmup-logs 5

An INPUT is one of:
- a trainer run directory (the trainer's metrics.output_dir, holding metrics.jsonl and run.json), or
  that metrics.jsonl itself: rank 0's JSON lines (trainer/metrics.py) and the run info the trainer
  writes at start (trainer/train.py: world size, resolved config, mesh, device). The first
  --warmup-logs logged steps of every launch are warm-up and compilation and are dropped (a new
  launch starts where restart_count changes or the step goes back, as after a resume); the figures
  are the medians of the remaining logged steps, peak memory included. Series:
  `<model.name> <sharding_strategy>`; HYBRID_SHARD adds its shard group size (mesh.shard).
- any other file: JSON lines of benchmarks/common.py emit(), one measured configuration a line (the
  benchmark already dropped its warm-up and took the median step time). Series: the `name`.

A series is one configuration across world sizes: where one series name covers several
configurations (model, sequence length, batch, precision, strategy, checkpointing; a suite run over
models, say), each becomes its own series, named with the fields that tell them apart
(`default (model llama2-7b)`), so no efficiency mixes two models.
Repeated measurements of one series at one world size are combined by their median (the table
counts them). Per point: tokens/s per GPU, tokens/s in total (per GPU x GPUs), MFU, step time, peak
memory, scaling efficiency = tokens/s per GPU / tokens/s per GPU of the same series at the
baseline world size (--baseline-world-size; default the smallest world size of each series), and
the tokens/s per GPU the plan's speed model predicts for it (generators/plan/speed.py) with its error.
Series are sorted by name and points by world size, so the output does not depend on input order.

Output: the Markdown table on stdout; with --out DIR also DIR/report.md (the table, both charts and
the source of every measurement with its command), DIR/scaling.svg (tokens/s per GPU against GPUs
on a log2 axis, with a dashed ideal-scaling line and efficiency labels per series) and DIR/mfu.svg
(MFU against GPUs), written through the generators' writer (generators/core/writer.py; unchanged files
are left alone). The same inputs give the same bytes. Bad input (a missing file, a line that is not
JSON, a missing or mistyped key, no records) prints one line on stderr naming the file, line and key
with the fix, exits 2 and writes nothing; failing to write exits 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

# `python generators/report.py` runs the packages of the checkout it is in, never those of another checkout
# installed in the same environment (`pip install -e`): this checkout's root goes first on the import path.
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generators.core.cli import errors_to_exit_codes, output_dir, sync, version_option
from generators.core.errors import InputError
from generators.results.measurements import DEFAULT_WARMUP_LOGS, Measurement, Point, load, summarise
from generators.results.render import GENERATOR, markdown_table, render

# The checkout this command belongs to (an --out that holds it is refused).
REPO_ROOT = Path(__file__).resolve().parent.parent


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.argument("inputs", nargs=-1, metavar="INPUT...")
@click.option("--out", metavar="DIR", default=None, help="Also write report.md, scaling.svg and mfu.svg into DIR.")
@click.option(
    "--baseline-world-size",
    type=int,
    metavar="N",
    default=None,
    help="World size that counts as 100% efficiency (default: the smallest of each series).",
)
@click.option(
    "--warmup-logs",
    type=int,
    metavar="N",
    default=DEFAULT_WARMUP_LOGS,
    show_default=True,
    help="Logged steps dropped at the start of every trainer launch (warm-up, compilation).",
)
@errors_to_exit_codes
def main(inputs: tuple[str, ...], out: str | None, baseline_world_size: int | None, warmup_logs: int) -> None:
    """Scaling report from benchmark JSON lines and trainer run directories (INPUT...)."""
    out_dir = output_dir(out, Path(), REPO_ROOT) if out is not None else None
    if baseline_world_size is not None and baseline_world_size < 1:
        raise InputError(
            f"must be at least 1, got {baseline_world_size}",
            key="--baseline-world-size",
            fix="pass a world size of the series, or leave the option out",
        )
    if warmup_logs < 0:
        raise InputError(
            f"must be 0 or more, got {warmup_logs}",
            key="--warmup-logs",
            fix="pass how many logged steps to drop at the start of each launch",
        )
    measurements: list[Measurement] = load(inputs, warmup_logs)
    points: list[Point] = summarise(measurements, baseline_world_size)
    files: dict[str, bytes] = render(points, baseline_world_size) if out_dir is not None else {}
    click.echo(markdown_table(points))
    if out_dir is None:
        return
    sync(out_dir, files, check=False, generator=GENERATOR, rerun=f"python {GENERATOR}", what="of the report")


if __name__ == "__main__":
    main()
