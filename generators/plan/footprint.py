"""What each cluster's shared volume (PVC fsdp-shared, mounted at /shared) holds at its fullest, against
its size (the cluster's shared_storage_gib): the footprint `expand.py --plan` shows, and the check by
which `expand.py` and `validate.py` refuse a matrix that overflows a volume.

Per run (sizes in GiB, 2^30 bytes; one checkpoint by trainer.storage.checkpoint_bytes, the size the
trainer's start check uses: fp32 parameters and AdamW moments, 12 bytes a parameter, 8 with
training.bf16_optimizer_state, plus DCP's overhead for the run's world size and writer threads):

at its start     room for (keep_last + 1) checkpoints: the trainer refuses to start where
                 checkpoint.dir has less (trainer/storage.py), whatever it will write.
while it trains  what it holds at most: rotation keeps keep_last and writes the next beside them, so
                 keep_last + 1 checkpoints, or as many as it writes where that is fewer; or the
                 checkpoints it keeps plus its export, if that is more.
kept after       the checkpoints rotation leaves when it ends: keep_last, or fewer where the run saves
                 fewer times (interval saves before the end plus the final one, from the plan's step
                 count; keep_last where the dataset's size is unknown); plus its Hugging Face export
                 (checkpoint.export_dir under /shared: 2 bytes a parameter, 4 with fp32 precision).
                 Nothing removes them: they stay until someone deletes them.

Per cluster, conservatively:

    footprint = (every run's kept checkpoints and export
                 + the largest in-flight extra: of the sets of runs that may train at once, the one
                   whose (while it trains - kept after) adds up to most
                 + the start room: the largest (at its start - kept after) of any run) x (1 + MARGIN)
              + the model cache + the datasets

Runs that may train at once: any set of the cluster's runs of one instance type whose nodes add up to
at most max_nodes (the node group's maximum; each instance type has its own), so the in-flight extra
is the best such set of each instance type (a knapsack over nodes), added up. Counting every other
run's kept checkpoints at the same time assumes the rest have all finished: the worst order; and the
run starting last, with the most to ask of its start check, still finds its room.
MARGIN is trainer.storage's (the file system's own metadata and small files beside the checkpoints).
The model cache (HF_HOME=/shared/cache/huggingface): each distinct model a run loads from the hub or
from /shared, its weights in bf16 (2 bytes a parameter: the safetensors trainer/model.py downloads),
once per cluster. Datasets: each distinct data.path under /shared/data, its tokens per epoch
(estimate.dataset_tokens) at overheads.BYTES_PER_TOKEN; a dataset of unknown size counts 0.

Not counted: what runs no longer in the matrix left on the volume (their checkpoints stay under their
old names), metrics and logs (/shared/runs, small), extra checkpoints of a run stopped and resumed
(a SIGTERM writes one more save, so such a run can keep up to keep_last).

The fix the refusal names: the smallest FSx for Lustre size that holds the footprint (1200 GiB, or a
multiple of 2400 GiB: PERSISTENT_2's sizes), a lower trainer.checkpoint.keep_last for the largest runs,
or retention after export: set trainer.checkpoint.export_dir, copy the finished runs' exports and
checkpoints off the volume, delete them there and remove those runs from the matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from generators.core.errors import InputError
from generators.core.markdown import table
from generators.matrix import expand, load
from generators.matrix.load import Matrix
from generators.plan import SHARED_MOUNT, Plan
from generators.plan.estimate import dataset_tokens, plan_fitting
from generators.plan.overheads import BYTES_PER_TOKEN, SHARED_DATA_ROOT
from generators.plan.speed import steps_per_epoch
from trainer.catalog import MODELS
from trainer.storage import MARGIN, checkpoint_bytes

GIB = 1024**3
# FSx for Lustre PERSISTENT_2 sizes: 1200 GiB, then multiples of 2400 GiB.
FSX_SMALLEST_GIB = 1200
FSX_STEP_GIB = 2400
# Runs named in a refusal: the largest, by what they need while they train.
NAMED_RUNS = 3


def _on_volume(path: str) -> bool:
    return path == SHARED_MOUNT or path.startswith(SHARED_MOUNT + "/")


@dataclass(frozen=True, kw_only=True)
class RunFootprint:
    """One run's share of its cluster's shared volume, GiB."""

    name: str
    cluster: str
    instance_type: str
    nodes: int
    keep_last: int
    checkpoint_gib: float  # one checkpoint
    kept_checkpoints: int  # how many it keeps after it ends
    export_gib: float  # its export under /shared, 0 without one
    start_gib: float  # the room its start check asks for
    training_gib: float  # at its fullest while it trains
    kept_gib: float  # after it ends: kept checkpoints and the export

    @property
    def extra_gib(self) -> float:
        """What it needs while it trains beyond what it keeps."""
        return self.training_gib - self.kept_gib

    @property
    def start_extra_gib(self) -> float:
        """What its start check asks for beyond what it keeps."""
        return max(0.0, self.start_gib - self.kept_gib)


@dataclass(frozen=True, kw_only=True)
class ClusterFootprint:
    """A cluster's shared volume at its fullest (the module docstring says how it is counted)."""

    cluster: str
    size_gib: int  # shared_storage_gib
    runs: tuple[RunFootprint, ...]  # in matrix order
    in_flight: tuple[str, ...]  # the runs of the largest in-flight extra
    start_run: str  # the run whose start check asks for the most room beyond what it keeps
    models: tuple[str, ...]  # the model cache: the models, once each
    model_cache_gib: float
    datasets: tuple[str, ...]
    datasets_gib: float

    @property
    def kept_gib(self) -> float:
        return sum(r.kept_gib for r in self.runs)

    @property
    def in_flight_gib(self) -> float:
        names = set(self.in_flight)
        return sum(r.extra_gib for r in self.runs if r.name in names)

    @property
    def start_gib(self) -> float:
        return max((r.start_extra_gib for r in self.runs), default=0.0)

    @property
    def total_gib(self) -> float:
        checkpoints = self.kept_gib + self.in_flight_gib + self.start_gib
        return checkpoints * (1 + MARGIN) + self.model_cache_gib + self.datasets_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.size_gib

    @property
    def size_needed_gib(self) -> int:
        """The smallest FSx for Lustre size that holds the footprint."""
        if self.total_gib <= FSX_SMALLEST_GIB:
            return FSX_SMALLEST_GIB
        return math.ceil(self.total_gib / FSX_STEP_GIB) * FSX_STEP_GIB


def checkpoints_written(p: Plan) -> int | None:
    """Saves of an uninterrupted run (interval saves before the end, then the final one); None when
    its step count is unknown."""
    cfg = p.trainer
    steps = cfg.training.max_steps
    if not steps:
        tokens, _ = dataset_tokens(cfg)
        if tokens is None:
            return None
        steps = cfg.training.num_epochs * steps_per_epoch(tokens, cfg, p.world_size)
    interval = cfg.checkpoint.interval_steps
    return ((steps - 1) // interval if interval else 0) + 1


def run_footprint(p: Plan) -> RunFootprint:
    cfg = p.trainer
    ck = cfg.checkpoint
    arch = MODELS[p.model]
    checkpoint = 0.0
    kept = held = 0
    if ck.dir:
        checkpoint = checkpoint_bytes(arch, cfg.training.bf16_optimizer_state, p.world_size, ck.writer_threads) / GIB
        written = checkpoints_written(p)
        kept = ck.keep_last if written is None else min(ck.keep_last, written)
        held = ck.keep_last + 1 if written is None else min(ck.keep_last + 1, written)
    export = 0.0
    if ck.export_dir and _on_volume(ck.export_dir):
        export = arch.num_params * (4 if cfg.parallelism.precision == "fp32" else 2) / GIB
    kept_gib = kept * checkpoint + export
    training = max(held * checkpoint, kept_gib)
    return RunFootprint(
        name=p.name,
        cluster=p.cluster,
        instance_type=p.instance_type,
        nodes=p.nodes,
        keep_last=ck.keep_last,
        checkpoint_gib=checkpoint,
        kept_checkpoints=kept,
        export_gib=export,
        start_gib=(ck.keep_last + 1) * checkpoint if ck.dir else 0.0,
        training_gib=training,
        kept_gib=kept_gib,
    )


def _largest_set(runs: Sequence[RunFootprint], max_nodes: int) -> list[RunFootprint]:
    """The runs, of one instance type, whose nodes add up to at most max_nodes and whose in-flight
    extra adds up to most (0/1 knapsack over nodes; the earlier runs win ties)."""
    # best[n]: (extra, indices) of the best set using at most n nodes.
    best: list[tuple[float, tuple[int, ...]]] = [(0.0, ())] * (max_nodes + 1)
    for i, r in enumerate(runs):
        if r.extra_gib <= 0 or r.nodes > max_nodes:
            continue
        for n in range(max_nodes, r.nodes - 1, -1):
            value, chosen = best[n - r.nodes]
            if value + r.extra_gib > best[n][0]:
                best[n] = (value + r.extra_gib, chosen + (i,))
    return [runs[i] for i in best[max_nodes][1]]


def cluster_footprints(matrix: Matrix, plans: Sequence[Plan]) -> list[ClusterFootprint]:
    """The footprint of every cluster with runs among `plans` (runs that will run: leave refused ones
    out), in the order of the matrix's clusters."""
    out = []
    for name, cluster in matrix.clusters.items():
        mine = [p for p in plans if p.cluster == name]
        if not mine:
            continue
        runs = [run_footprint(p) for p in mine]
        in_flight: list[str] = []
        for instance_type in dict.fromkeys(r.instance_type for r in runs):
            chosen = _largest_set([r for r in runs if r.instance_type == instance_type], cluster.max_nodes)
            in_flight += [r.name for r in chosen]
        models: dict[str, float] = {}
        datasets: dict[str, float] = {}
        for p in mine:
            path = p.trainer.model.path
            if path and (_on_volume(path) or not path.startswith("/")):
                models.setdefault(path, MODELS[p.model].num_params * 2 / GIB)
            data = p.trainer.data
            if data.format != "synthetic" and data.path.startswith(SHARED_DATA_ROOT):
                tokens, _ = dataset_tokens(p.trainer)
                datasets.setdefault(data.path, (tokens or 0) * BYTES_PER_TOKEN / GIB)
        out.append(
            ClusterFootprint(
                cluster=name,
                size_gib=cluster.shared_storage_gib,
                runs=tuple(runs),
                in_flight=tuple(in_flight),
                start_run=max(runs, key=lambda r: r.start_extra_gib).name,
                models=tuple(models),
                model_cache_gib=sum(models.values()),
                datasets=tuple(datasets),
                datasets_gib=sum(datasets.values()),
            )
        )
    return out


def gib_text(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:,.1f}"


def largest_runs(fp: ClusterFootprint) -> list[RunFootprint]:
    return sorted(fp.runs, key=lambda r: -max(r.start_gib, r.training_gib))[:NAMED_RUNS]


def fix_text(fp: ClusterFootprint) -> str:
    """The changes that make the cluster's footprint fit: a larger volume, fewer checkpoints kept, or
    checkpoints moved off the volume."""
    keep = sorted({r.keep_last for r in largest_runs(fp)})
    keep_text = (
        f"lower trainer.checkpoint.keep_last of the largest runs (now {', '.join(map(str, keep))})"
        if max(keep) > 1
        else "plan fewer of the largest runs on this cluster"
    )
    return (
        f"raise clusters.{fp.cluster}.shared_storage_gib to {fp.size_needed_gib} (FSx for Lustre: 1200 or a "
        f"multiple of 2400), {keep_text}, or export (trainer.checkpoint.export_dir), move finished runs' "
        "checkpoints off the volume and remove those runs from the matrix (docs/plan.md, shared volume)"
    )


def overflow_error(matrix: Matrix, fp: ClusterFootprint) -> InputError:
    """The one line that refuses a cluster whose footprint does not fit its volume."""
    cluster = matrix.clusters[fp.cluster]
    line = cluster.lines.get("shared_storage_gib", cluster.lines.get("name", 0))
    named = ", ".join(
        f"{r.name} ({gib_text(max(r.start_gib, r.training_gib))} GiB at its start, {gib_text(r.kept_gib)} kept)"
        for r in largest_runs(fp)
    )
    return InputError(
        f"the shared volume needs {gib_text(fp.total_gib)} GiB at its fullest (checkpoints kept "
        f"{gib_text(fp.kept_gib)}, in flight {gib_text(fp.in_flight_gib)}, start room {gib_text(fp.start_gib)}, "
        f"{MARGIN:.0%} margin, model cache "
        f"{gib_text(fp.model_cache_gib)}, datasets {gib_text(fp.datasets_gib)}) but holds {fp.size_gib:,} GiB; "
        f"largest runs: {named}",
        file=matrix.file,
        line=line,
        key=f"clusters.{fp.cluster}.shared_storage_gib",
        fix=fix_text(fp),
    )


def check_footprints(matrix: Matrix, plans: Sequence[Plan]) -> None:
    """Raise InputError for the first cluster whose footprint does not fit its shared volume."""
    for fp in cluster_footprints(matrix, plans):
        if not fp.fits:
            raise overflow_error(matrix, fp)


FOOTPRINT_HEADER = (
    "cluster",
    "shared volume, GiB",
    "checkpoints kept, GiB",
    "in flight, GiB (runs)",
    "start room, GiB",
    "model cache, GiB (models)",
    "datasets, GiB",
    "footprint, GiB",
    "fits",
)
RUN_HEADER = (
    "cluster",
    "run",
    "checkpoint, GiB",
    "keep_last",
    "at its start, GiB",
    "while it trains, GiB",
    "kept after, GiB",
    "of it export, GiB",
)


def footprint_markdown(footprints: Sequence[ClusterFootprint]) -> str:
    """The plan's shared-volume section: a row per cluster, then a row per run (its cluster first, so
    that the plan table stays the one whose rows start with a run's name)."""
    clusters = [
        [
            fp.cluster,
            f"{fp.size_gib:,}",
            gib_text(fp.kept_gib),
            f"{gib_text(fp.in_flight_gib)} ({len(fp.in_flight)})",
            gib_text(fp.start_gib),
            f"{gib_text(fp.model_cache_gib)} ({len(fp.models)})",
            gib_text(fp.datasets_gib),
            gib_text(fp.total_gib),
            "yes" if fp.fits else f"NO: needs {fp.size_needed_gib:,}",
        ]
        for fp in footprints
    ]
    runs = [
        [
            r.cluster,
            r.name,
            gib_text(r.checkpoint_gib),
            str(r.keep_last),
            gib_text(r.start_gib),
            gib_text(r.training_gib),
            gib_text(r.kept_gib) + (f" ({r.kept_checkpoints} kept)" if r.checkpoint_gib else ""),
            gib_text(r.export_gib),
        ]
        for fp in footprints
        for r in fp.runs
    ]
    lines = [
        "Shared volume (PVC fsdp-shared at /shared) at its fullest, per cluster: every run's kept checkpoints and "
        "exports, plus what the runs that may train at once (nodes within max_nodes) hold beyond that, plus the "
        "room the largest run's start check asks for (keep_last + 1 checkpoints), with a "
        f"{MARGIN:.0%} margin, plus the model cache and the datasets (generators/plan/footprint.py).",
        "",
        table(FOOTPRINT_HEADER, clusters),
        "",
        table(RUN_HEADER, runs, left=2),
    ]
    for fp in footprints:
        if not fp.fits:
            lines += [
                "",
                f"- {fp.cluster} DOES NOT FIT: {gib_text(fp.total_gib)} GiB on {fp.size_gib:,}; fix: {fix_text(fp)}.",
            ]
    return "\n".join(lines)


def check_matrix_file(path: str) -> None:
    """`validate.py`'s check of the committed matrix: planned as `expand.py` plans it (InputError on a
    bad run), then every cluster's footprint against its shared volume."""
    m = load(path)
    check_footprints(m, [p for cluster_plan in plan_fitting(m, expand(m)) for p in cluster_plan.runs])
