"""Load an experiment matrix strictly into a `Matrix` (what generators/matrix/expand.py expands).

The format (apiVersion fsdp-gitops/v1, kind ExperimentMatrix); every section but `clusters` and
`repository` is optional:

    apiVersion: fsdp-gitops/v1
    kind: ExperimentMatrix
    repository: {url: https://github.com/example/fsdp-gitops, branch: main}   # what Flux syncs
    clusters:                      # name -> what the cluster offers (see CLUSTER_FIELDS)
      fsdp-p5: {region: us-west-2, availability_zones: [us-west-2a], instance_types: [p5.48xlarge]}
    defaults:                      # run fields every run starts from (see RUN_FIELDS)
      trainer: {training: {num_epochs: 5}}
    axes:                          # run field (dotted path) -> list of values; cartesian product
      model: [llama2-7b, llama2-13b]
      nodes: [1, 2]
      trainer.parallelism.sharding_strategy: [FULL_SHARD, HYBRID_SHARD]
    exclude:                       # partial matches removed from the product
      - {model: llama2-13b, nodes: 1}
    include:                       # extra explicit runs, each on top of `defaults`
      - {model: llama2-7b, nodes: 4, cluster: fsdp-p5}

Rules, in the order they apply:
1. The YAML is strict: no duplicate keys at any level, no anchors, aliases or merge keys (`<<`),
   string keys only, one document. Unknown keys anywhere are errors, with the closest known key.
2. A run is a set of leaves (dotted path -> value). Mappings and dotted keys are interchangeable:
   `trainer: {training: {lr: 1e-4}}` and `trainer.training.lr: 1e-4` are the same leaf.
3. Axes: every combination of one value per axis, each laid over `defaults` (later axes win on a
   shared leaf). An axis on a section (e.g. `trainer.parallelism`) takes mappings as values, so
   settings that belong together vary together. No axes means no product: runs come from `include`.
4. Exclude: a product run is dropped when every leaf of an exclude entry equals the run's leaf (as
   written in the matrix, before defaults are resolved). An exclude entry matching nothing is an error
   (it is usually a typo). Exclude never applies to `include` runs.
5. Include: each entry laid over `defaults` is one more run.
Values are checked where they are written: types and ranges of run fields and known cluster, model
and instance type names at load, a run's `image` well formed and pinned by tag or digest
(generators/matrix/images.py), a `capacity_block_end` not past (generators/matrix/times.py); the
trainer section's values by trainer.config.from_dict when the run is planned (generators/plan/),
mapped back to the line that set them.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from generators.core.yamlio import LineDict, LineList, load_yaml, read_input
from generators.matrix.cluster_rules import check_registry, job_api_and_kueue
from generators.matrix.fields import (
    check_fields,
    check_keys,
    check_str_list,
    describe_value,
    field_error,
    is_type,
    require_mapping,
    suggest_key,
    type_word,
)
from generators.matrix.images import check as check_image
from generators.matrix.schema import (
    API_VERSION,
    CLUSTER_FIELDS,
    KIND,
    NAME_PREFIX_MAX,
    REPOSITORY_FIELDS,
    RUN_FIELDS,
    TOP_LEVEL_KEYS,
    Cluster,
    GitSource,
    known_at,
    schema_at,
)
from generators.matrix.times import check_block_end, utc_now
from trainer.catalog import INSTANCE_TYPES, MODELS

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}$")
_K8S_VERSION = re.compile(r"^1\.\d+$")
_GIT_URL = re.compile(r"^(https://|ssh://)\S+$")
# What `git check-ref-format --branch` refuses, so Flux never fails on the name later.
_BAD_BRANCH = re.compile(
    r"(^[-/.])|(\.\.)|([\x00-\x20\x7f~^:?*\[\\])|(@\{)|(//)|(/\.)|([/.]$)|(\.lock$)|(\.lock/)|(^@$)"
)
# A matrix larger than this is not a matrix (and would take long to refuse later).
MAX_MATRIX_BYTES = 4 * 1024 * 1024
# The most runs one matrix may expand to: well above any real experiment grid, small enough that a
# mistaken axis (10^6 or 10^9 combinations) is refused before the product is built.
MAX_RUNS = 20_000
# Kubernetes integer fields: replicas, ports and sizes are int32; activeDeadlineSeconds is int64.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Namespaces of Kubernetes, Flux and this repository's infrastructure (base/): runs never go there.
SYSTEM_NAMESPACES = frozenset(
    {
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "flux-system",
        "fsdp-system",
        "monitoring",
        "node-tools",
        "kubeflow",
        "kueue-system",
        "device-plugins",
    }
)


# --------------------------------------------------------------------------------------------
# The matrix as frozen data


@dataclass(frozen=True)
class Leaf:
    """One value of a run as written in the matrix."""

    value: Any
    # 1-based line of the key that set it.
    line: int
    # Full key in the matrix, e.g. "include[2].trainer.training.lr" or "axes.nodes[1]".
    key: str


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A partial run: `defaults`, one include/exclude item, or one value of an axis."""

    key: str
    line: int
    # Run path ("nodes", "trainer.training.lr") -> Leaf. Built once, never mutated.
    leaves: Mapping[str, Leaf]


@dataclass(frozen=True, kw_only=True)
class Axis:
    # Run path the axis varies, e.g. "nodes" or "trainer.parallelism".
    path: str
    key: str
    line: int
    values: tuple[Entry, ...]


@dataclass(frozen=True, kw_only=True)
class Matrix:
    # The matrix path as given (used in every error message and in the generated banners).
    file: str
    repository: GitSource
    clusters: Mapping[str, Cluster]
    defaults: Entry
    axes: tuple[Axis, ...]
    include: tuple[Entry, ...]
    exclude: tuple[Entry, ...]
    # Line of the `axes` key (0 when absent): where a run from the product points when no leaf does.
    axes_line: int
    # The time the matrix was checked at (a capacity_block_end must lie after it); the run-window
    # warning of generators/plan/window.py measures from it too.
    checked_at: dt.datetime = field(compare=False)


def _parse_repository(file: str, data: Any, line: int) -> GitSource:
    data = require_mapping(file, data, line, "repository", "url and branch of the Git repository Flux syncs")
    f = check_fields(file, data, REPOSITORY_FIELDS, "repository")
    if not _GIT_URL.match(f["url"]):
        raise field_error(
            file,
            data.key_lines["url"],
            "repository.url",
            f"{f['url']!r} is not an https:// or ssh:// URL",
            "use the clone URL, e.g. https://github.com/example/fsdp-gitops",
        )
    if not f["branch"] or _BAD_BRANCH.search(f["branch"]):
        raise field_error(
            file,
            data.key_lines.get("branch", data.line),
            "repository.branch",
            f"{f['branch']!r} is not a valid Git branch name (git check-ref-format)",
            "name the branch Flux follows, e.g. main (no spaces, '..', '~^:?*[\\', '@{', leading '-')",
        )
    return GitSource(url=f["url"], branch=f["branch"])


def _parse_cluster(file: str, name: str, data: Any, line: int, now: dt.datetime) -> Cluster:
    prefix = f"clusters.{name}"
    if not _DNS1123_LABEL.match(name) or len(name) > 30:
        raise field_error(
            file,
            line,
            prefix,
            f"cluster name {name!r} is not a DNS-1123 label of at most 30 characters",
            "use lowercase letters, digits and '-', e.g. fsdp-p5",
        )
    data = require_mapping(file, data, line, prefix, "what the cluster offers")
    f = check_fields(file, data, CLUSTER_FIELDS, prefix)
    if not _DNS1123_LABEL.match(f["namespace"]) or len(f["namespace"]) > 63:
        raise field_error(
            file,
            data.key_lines.get("namespace", data.line),
            f"{prefix}.namespace",
            f"{f['namespace']!r} is not a namespace name",
            "use a DNS-1123 label, e.g. fsdp",
        )
    if f["namespace"] in SYSTEM_NAMESPACES or f["namespace"].startswith("kube-"):
        raise field_error(
            file,
            data.key_lines.get("namespace", data.line),
            f"{prefix}.namespace",
            f"{f['namespace']!r} is a system namespace (Kubernetes, Flux or this repository's infrastructure)",
            "give the runs a namespace of their own, e.g. fsdp",
        )
    types = check_str_list(file, data, "instance_types", prefix, None, "instance type", nonempty=True)
    for i, itype in enumerate(types):
        if itype not in INSTANCE_TYPES:
            raise field_error(
                file,
                data["instance_types"].item_lines[i],
                f"{prefix}.instance_types[{i}]",
                f"unknown instance type {itype!r}",
                f"use one of {', '.join(sorted(INSTANCE_TYPES))}",
            )
    if not _REGION.match(f["region"]):
        raise field_error(
            file,
            data.key_lines["region"],
            f"{prefix}.region",
            f"{f['region']!r} is not an AWS region",
            "write a region such as us-west-2",
        )
    zones = check_str_list(file, data, "availability_zones", prefix, None, "availability zone", nonempty=True)
    for i, zone in enumerate(zones):
        if not re.fullmatch(re.escape(f["region"]) + r"[a-z]", zone):
            raise field_error(
                file,
                data["availability_zones"].item_lines[i],
                f"{prefix}.availability_zones[{i}]",
                f"{zone!r} is not a zone of region {f['region']}",
                f"write a zone such as {f['region']}a",
            )
    reservations = check_str_list(
        file,
        data,
        "capacity_reservation_ids",
        prefix,
        _RESERVATION,
        "capacity reservation id (cr- and 8 to 17 hex digits)",
        nonempty=False,
    )
    if f["capacity_blocks"] and not reservations:
        raise field_error(
            file,
            data.key_lines["capacity_blocks"],
            f"{prefix}.capacity_blocks",
            "capacity_blocks is true but the cluster names no capacity reservation",
            "list the Capacity Block ids (cr-...) in capacity_reservation_ids, or remove capacity_blocks",
        )
    kueue = job_api_and_kueue(file, data, prefix, f["job_api"], f["kueue"])
    if f["capacity_block_end"]:
        check_block_end(file, data, prefix, f["capacity_block_end"], f["capacity_blocks"], now)
    check_registry(file, data, prefix, f["registry"])
    if not _K8S_VERSION.match(f["kubernetes_version"]):
        raise field_error(
            file,
            data.key_lines["kubernetes_version"],
            f"{prefix}.kubernetes_version",
            f"{f['kubernetes_version']!r} is not a Kubernetes minor version",
            'write it quoted, e.g. "1.33"',
        )
    for field_name, least in (("volume_size_gib", 20), ("max_nodes", 1), ("shared_storage_gib", 1)):
        if f[field_name] < least:
            raise field_error(
                file,
                data.key_lines.get(field_name, data.line),
                f"{prefix}.{field_name}",
                f"{f[field_name]} is too small",
                f"set it to at least {least}",
            )
        if f[field_name] > INT32_MAX:
            raise field_error(
                file,
                data.key_lines.get(field_name, data.line),
                f"{prefix}.{field_name}",
                f"{f[field_name]} is more than eksctl and Kubernetes accept ({INT32_MAX})",
                "use a realistic size",
            )
    return Cluster(
        name=name,
        namespace=f["namespace"],
        instance_types=types,
        region=f["region"],
        availability_zones=zones,
        capacity_reservation_ids=reservations,
        volume_size_gib=f["volume_size_gib"],
        kubernetes_version=f["kubernetes_version"],
        max_nodes=f["max_nodes"],
        shared_storage_gib=f["shared_storage_gib"],
        kueue=kueue,
        capacity_blocks=f["capacity_blocks"],
        job_api=f["job_api"],
        capacity_block_end=f["capacity_block_end"],
        registry=f["registry"],
        lines={"name": line, **data.key_lines},
    )


class _Flattener:
    """Turns a (partial) run mapping into leaves, checking every path and run-field value."""

    def __init__(self, file: str, clusters: Mapping[str, Cluster]):
        self.file = file
        self.clusters = clusters

    def entry(self, data: Any, line: int, key: str, base_path: str = "") -> Entry:
        leaves: dict[str, Leaf] = {}
        self._walk(data, line, key, base_path, leaves)
        return Entry(key=key, line=line, leaves=leaves)

    def _walk(self, value: Any, line: int, key: str, path: str, leaves: dict[str, Leaf]) -> None:
        node = schema_at(path)
        if isinstance(node, dict):  # a section (or the run itself)
            what = "run fields" if not path else f"keys of {path}"
            data = require_mapping(self.file, value, line, key, what)
            for sub, sub_value in data.items():
                sub_line = data.key_lines[sub]
                sub_key = f"{key}.{sub}"
                sub_path = f"{path}.{sub}" if path else sub
                if not _schema_ok(sub_path):
                    raise field_error(self.file, sub_line, sub_key, *_unknown_key(path, sub, "use a known key"))
                self._walk(sub_value, sub_line, sub_key, sub_path, leaves)
            return
        if path in leaves:
            raise field_error(
                self.file,
                line,
                key,
                f"{path} is set twice in this entry (first at line {leaves[path].line})",
                "set it once, either nested or as a dotted key",
            )
        leaves[path] = Leaf(self.value(path, value, line, key), line, key)

    def value(self, path: str, value: Any, line: int, key: str) -> Any:
        """Check a leaf value: run fields fully here, trainer values later by from_dict."""
        if isinstance(value, (Mapping, list)):
            raise field_error(
                self.file,
                line,
                key,
                f"got {describe_value(value)}; must be a single value",
                "give one value (use `axes` to vary it)",
            )
        if path.startswith("trainer."):
            if isinstance(value, float) and not math.isfinite(value):
                raise field_error(self.file, line, key, f"{value} is not a finite number", "give a finite number")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
                raise field_error(self.file, line, key, f"{value} does not fit in 64 bits", "give a smaller number")
            return value
        spec = RUN_FIELDS[path]
        tp = spec.type
        if not is_type(value, tp):
            fix = f"set {path} to {type_word(tp)}"
            if tp is str and value is not None and not isinstance(value, bool):
                fix = f'quote it: {path}: "{value}"'
            raise field_error(self.file, line, key, f"got {describe_value(value)}; must be {type_word(tp)}", fix)
        if spec.choices and value not in spec.choices:
            what = "rendezvous backend" if path == "rdzv_backend" else path
            raise field_error(
                self.file, line, key, f"unknown {what} {value!r}", f"use {' or '.join(map(str, spec.choices))}"
            )
        if path == "cluster" and value not in self.clusters:
            raise field_error(
                self.file,
                line,
                key,
                f"unknown cluster {value!r}",
                f"use one of the clusters defined under clusters: {', '.join(sorted(self.clusters)) or '(none)'}",
            )
        if path == "model" and value not in MODELS:
            raise field_error(
                self.file, line, key, f"unknown model {value!r}", f"use one of {', '.join(sorted(MODELS))}"
            )
        if path == "instance_type" and value not in INSTANCE_TYPES:
            raise field_error(
                self.file,
                line,
                key,
                f"unknown instance type {value!r}",
                f"use one of {', '.join(sorted(INSTANCE_TYPES))}",
            )
        least = spec.minimum
        if least is not None and value < least:
            raise field_error(self.file, line, key, f"{value} is below {least}", f"set {path} to {least} or more")
        most = spec.maximum if spec.maximum is not None else INT32_MAX
        if tp is int and value > most:
            raise field_error(
                self.file,
                line,
                key,
                f"{value} is more than the cluster accepts ({most})",
                f"set {path} to at most {most}",
            )
        if path == "image":
            what, fix = check_image(value)
            if what:
                raise field_error(self.file, line, key, what if value else "is empty", fix)
        if path == "name" and (not _DNS1035_LABEL.match(value) or len(value) > NAME_PREFIX_MAX):
            raise field_error(
                self.file,
                line,
                key,
                f"{value!r} is not a DNS-1035 label of at most {NAME_PREFIX_MAX} characters",
                "use lowercase letters, digits and '-', starting with a letter",
            )
        return value


def parse(data: Any, file: str, *, now: dt.datetime | None = None) -> Matrix:
    """Validate the loaded YAML and build the Matrix (first error wins); `now` (default: utc_now())
    is the time a capacity_block_end must lie after, and the Matrix keeps it as checked_at."""
    now = now if now is not None else utc_now()
    if data is None:
        raise field_error(
            file,
            1,
            "(top level)",
            "the file is empty",
            f"start with 'apiVersion: {API_VERSION}' and 'kind: {KIND}' (see docs/matrix.md)",
        )
    if not isinstance(data, LineDict):
        raise field_error(
            file,
            1,
            "(top level)",
            f"the top level is {describe_value(data)}, not a mapping",
            "write the sections apiVersion, kind, repository, clusters, defaults, axes, include, exclude",
        )
    check_keys(file, data, TOP_LEVEL_KEYS, "")
    lines = data.key_lines
    if data.get("apiVersion") != API_VERSION:
        raise field_error(
            file,
            lines.get("apiVersion", data.line),
            "apiVersion",
            f"got {describe_value(data.get('apiVersion'))}; this generator reads {API_VERSION}",
            f"set apiVersion: {API_VERSION}",
        )
    if data.get("kind") != KIND:
        raise field_error(
            file, lines.get("kind", data.line), "kind", f"got {describe_value(data.get('kind'))}", f"set kind: {KIND}"
        )
    for required in ("repository", "clusters"):
        if required not in data:
            raise field_error(
                file, data.line, required, "is required", f"add a {required} section (see docs/matrix.md)"
            )
    repository = _parse_repository(file, data["repository"], lines["repository"])

    raw_clusters = require_mapping(file, data["clusters"], lines["clusters"], "clusters", "cluster name -> settings")
    if not raw_clusters:
        raise field_error(file, lines["clusters"], "clusters", "no cluster defined", "define at least one cluster")
    clusters = {
        name: _parse_cluster(file, name, value, raw_clusters.key_lines[name], now)
        for name, value in raw_clusters.items()
    }

    flat = _Flattener(file, clusters)
    defaults = flat.entry(data.get("defaults", _empty(data.line)), lines.get("defaults", data.line), "defaults")

    axes: list[Axis] = []
    if "axes" in data:
        raw_axes = require_mapping(file, data["axes"], lines["axes"], "axes", "run field -> list of values")
        for path, values in raw_axes.items():
            aline = raw_axes.key_lines[path]
            akey = f"axes.{path}"
            if not _schema_ok(path):
                raise field_error(file, aline, akey, *_unknown_key("", path, "use a run field or dotted trainer key"))
            if not isinstance(values, LineList) or not values:
                raise field_error(
                    file,
                    aline,
                    akey,
                    f"got {describe_value(values)}; an axis is a non-empty list of values",
                    f"write {path}: [value1, value2, ...]",
                )
            entries = tuple(flat.entry(v, values.item_lines[i], f"{akey}[{i}]", path) for i, v in enumerate(values))
            seen: dict[Any, int] = {}
            for i, e in enumerate(entries):
                sig = _signature(e.leaves)
                if sig in seen:
                    raise field_error(file, e.line, e.key, f"same value as {akey}[{seen[sig]}]", "list each value once")
                seen[sig] = i
            axes.append(Axis(path=path, key=akey, line=aline, values=entries))

    include = _entries(file, data, "include", flat)
    product = math.prod(len(axis.values) for axis in axes) if axes else 0
    if product + len(include) > MAX_RUNS:
        raise field_error(
            file,
            lines.get("axes", data.line),
            "axes",
            f"the matrix would expand to {product + len(include):,} runs, more than the cap of {MAX_RUNS:,}",
            "split it into several matrices or use fewer values per axis (exclude applies after the product)",
        )
    exclude = _entries(file, data, "exclude", flat)
    for e in exclude:
        if not e.leaves:
            raise field_error(
                file, e.line, e.key, "an empty exclude entry would remove every run", "name the keys to match"
            )
    if not axes and not include:
        raise field_error(file, data.line, "axes", "the matrix defines no runs", "add axes or include entries")
    return Matrix(
        file=file,
        repository=repository,
        clusters=clusters,
        defaults=defaults,
        axes=tuple(axes),
        include=include,
        exclude=exclude,
        axes_line=lines.get("axes", 0),
        checked_at=now,
    )


def _schema_ok(path: str) -> bool:
    try:
        schema_at(path)
        return True
    except KeyError:
        return False


def _unknown_key(base: str, written: str, use: str) -> tuple[str, str]:
    """(message, fix) for a key written under run path `base` ("" = the run) that is not in the
    schema; a dotted key is hinted at the level of its first unknown part, among that level's keys
    only, and the suggestion is the whole key as it would be written ('checkpoint.interval_steps')."""
    parts = written.split(".")
    level, i = base, 0
    while parts[i] in known_at(level):  # the caller found the whole path unknown: this stops
        level = f"{level}.{parts[i]}" if level else parts[i]
        i += 1
    part, known = parts[i], known_at(level)
    if not known:  # a value has no keys under it
        return f"unknown key {part!r}: {level} is a value, not a mapping", f"set {level} itself, not keys under it"
    before = "".join(f"{p}." for p in parts[:i])
    after = "".join(f".{p}" for p in parts[i + 1 :])
    return f"unknown key {part!r}", f"{use} ({suggest_key(part, known, before=before, after=after, level=level)})"


def _empty(line: int) -> LineDict:
    out = LineDict()
    out.line = line
    out.key_lines = {}
    return out


def _entries(file: str, data: LineDict, section: str, flat: _Flattener) -> tuple[Entry, ...]:
    if section not in data:
        return ()
    items = data[section]
    line = data.key_lines[section]
    if not isinstance(items, LineList):
        raise field_error(
            file,
            line,
            section,
            f"got {describe_value(items)}; must be a list of run mappings",
            f"write each {section} entry as '- key: value'",
        )
    return tuple(flat.entry(item, items.item_lines[i], f"{section}[{i}]") for i, item in enumerate(items))


def _signature(leaves: Mapping[str, Leaf]) -> tuple:
    """Type-aware identity of a set of leaves (so 1, 1.0 and true stay different)."""
    return tuple(sorted((p, type(leaf.value).__name__, repr(leaf.value)) for p, leaf in leaves.items()))


def load(path: str, text: str | None = None, *, now: dt.datetime | None = None) -> Matrix:
    """Read, strictly parse and validate a matrix file. `path` is used as given in messages; `now`
    as in parse()."""
    if text is None:
        text = read_input(
            path,
            key="MATRIX",
            fix="pass the path of an existing matrix file, e.g. matrix.yaml",
            max_bytes=MAX_MATRIX_BYTES,
        )
    return parse(load_yaml(text, path), path, now=now)
