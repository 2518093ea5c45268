"""List the runs of a cluster as the API server has them: job API, phase, progress, restarts.

    python generators/status.py                          # every namespace holding runs, as a table
    python generators/status.py --context prod -n fsdp   # one context, one namespace
    python generators/status.py --format json            # the same rows for scripts

A run is a PyTorchJob (kubeflow.org/v1) or a TrainJob (trainer.kubeflow.org/v1alpha1) labelled
app.kubernetes.io/part-of=fsdp-gitops, as every generated run is. Its progress is what global rank 0
writes as annotations (trainer/progress.py): on the TrainJob itself, or on its own pod for a
PyTorchJob; the newest record (fsdp-gitops/updated) among the job and its pods is shown.

Columns (json: the same fields, typed; null where the table shows "-"):
- PHASE: a PyTorchJob's true condition (Training Operator v1.9: the operator keeps one condition per
  type) by precedence Failed, Succeeded, Suspended, Restarting, Running, Created, else Pending (no
  condition yet). A TrainJob's conditions (Kubeflow Trainer 2.3: Complete, Failed, Suspended): Failed,
  Complete (shown as Succeeded, so both APIs read the same), Suspended; else Running when one of its
  JobSet's pods runs, else Pending.
- STEP: fsdp-gitops/step, "120/1000" (json: step and total_steps, integers).
- TOKENS/S, ETA ("1h02m", "done" at the end), CHECKPOINT (step of the last complete checkpoint):
  the annotations as written.
- RESTARTS: fsdp-gitops/restarts, else the sum of the restart counts of the run's pods' containers.

The API server is read with kubectl (`bash tools/setup.sh test` installs it, pinned in
requirements/test.txt), with the kubeconfig and context kubectl would use unless --kubeconfig and
--context say otherwise. A cluster without one of the two CRDs has no runs of that API. A missing
kubeconfig or context is bad input (exit 2); an API server that cannot be read is exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

# `python generators/status.py` runs the packages of the checkout it is in (see generators/expand.py).
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generators.core.cli import errors_to_exit_codes, version_option
from generators.core.errors import InputError, ToolError
from generators.core.gotools import tool

RUN_SELECTOR = "app.kubernetes.io/part-of=fsdp-gitops"
PREFIX = "fsdp-gitops/"  # trainer/progress.py PREFIX
# The two job APIs: kubectl resource name -> (API shown, the pod label naming the run's object).
APIS = {
    "pytorchjobs.kubeflow.org": ("PyTorchJob", "training.kubeflow.org/job-name"),
    # The Trainer names the JobSet after the TrainJob; JobSet labels every pod with its name.
    "trainjobs.trainer.kubeflow.org": ("TrainJob", "jobset.sigs.k8s.io/jobset-name"),
}
PYTORCHJOB_PHASES = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")
TRAINJOB_PHASES = {"Failed": "Failed", "Complete": "Succeeded", "Suspended": "Suspended"}
FORMATS = ("table", "json")
MISSING_TYPE = "the server doesn't have a resource type"
TIMEOUT_S = 60

Kubectl = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Row:
    """One run. Field names are the json keys."""

    namespace: str
    run: str
    api: str
    phase: str
    step: int | None
    total_steps: int | None
    tokens_per_second: int | None
    eta: str | None
    checkpoint: int | None
    restarts: int


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def _rate(text: str | None) -> int | None:
    try:
        return round(float(text)) if text else None
    except (ValueError, OverflowError):  # not a number, or nan/inf
        return None


def _true(obj: Mapping[str, Any]) -> set[str]:
    return {c.get("type", "") for c in obj.get("status", {}).get("conditions", []) if c.get("status") == "True"}


def phase(api: str, job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str:
    """The run's phase from its conditions (and for a TrainJob its pods); see the module docstring."""
    true = _true(job)
    if api == "PyTorchJob":
        return next((p for p in PYTORCHJOB_PHASES if p in true), "Pending")
    found = next((shown for cond, shown in TRAINJOB_PHASES.items() if cond in true), None)
    if found:
        return found
    return "Running" if any(p.get("status", {}).get("phase") == "Running" for p in pods) else "Pending"


def progress(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The newest progress record among the job's and its pods' annotations ({} when none has one)."""
    records = [
        o["metadata"].get("annotations") or {}
        for o in (job, *pods)
        if PREFIX + "step" in (o["metadata"].get("annotations") or {})
    ]
    return max(records, key=lambda a: a.get(PREFIX + "updated", ""), default={})


def row(api: str, job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Row:
    notes = progress(job, pods)
    step, _, total = notes.get(PREFIX + "step", "").partition("/")
    restarts = _int(notes.get(PREFIX + "restarts"))
    if restarts is None:
        restarts = sum(
            cs.get("restartCount", 0) for p in pods for cs in p.get("status", {}).get("containerStatuses", [])
        )
    return Row(
        namespace=job["metadata"]["namespace"],
        run=job["metadata"]["name"],
        api=api,
        phase=phase(api, job, pods),
        step=_int(step),
        total_steps=_int(total),
        tokens_per_second=_rate(notes.get(PREFIX + "tokens-per-second")),
        eta=notes.get(PREFIX + "eta") or None,
        checkpoint=_int(notes.get(PREFIX + "checkpoint")),
        restarts=restarts,
    )


def rows(jobs: Mapping[str, Sequence[Mapping[str, Any]]], pods: Sequence[Mapping[str, Any]]) -> list[Row]:
    """One row per run, by namespace and name; `jobs`: APIS key -> the objects kubectl listed."""
    out = []
    for resource, items in jobs.items():
        api, label = APIS[resource]
        for job in items:
            ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
            own = [
                p
                for p in pods
                if p["metadata"]["namespace"] == ns and (p["metadata"].get("labels") or {}).get(label) == name
            ]
            out.append(row(api, job, own))
    return sorted(out, key=lambda r: (r.namespace, r.run, r.api))


def kubectl_runner(kubeconfig: str | None, context: str | None) -> Kubectl:
    """A Kubectl that runs kubectl against `kubeconfig` and `context` (kubectl's defaults where None), each
    call with a request timeout, raising ToolError when the API server does not answer in TIMEOUT_S."""
    base = [tool("kubectl")]
    if kubeconfig:
        base.append(f"--kubeconfig={kubeconfig}")
    if context:
        base.append(f"--context={context}")

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [*base, "--request-timeout=30s", *args], capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise ToolError(f"kubectl {' '.join(args)}: no answer from the API server in {TIMEOUT_S} s") from None

    return run


def list_objects(kubectl: Kubectl, resource: str, namespace: str | None) -> list[dict[str, Any]]:
    """The objects of `resource` labelled as the project's ([] when the API server has no such type)."""
    args = ["get", resource, "-l", RUN_SELECTOR, "-o", "json", *(["-n", namespace] if namespace else ["-A"])]
    res = kubectl(args)
    if res.returncode == 0:
        items: list[dict[str, Any]] = json.loads(res.stdout).get("items", [])
        return items
    if MISSING_TYPE in res.stderr:
        return []  # the CRD is not installed: that job API has no runs here
    # kubectl's own message is its last line (client-go logs each retry above it).
    lines = [line.strip() for line in res.stderr.splitlines() if line.strip()]
    raise ToolError(f"kubectl {' '.join(args)}: {lines[-1] if lines else f'exit {res.returncode}'}")


def check_context(kubectl: Kubectl, context: str) -> None:
    """Bad input when the kubeconfig has no context `context` (kubectl would fail on every request)."""
    res = kubectl(["config", "get-contexts", "-o", "name"])
    names = res.stdout.split() if res.returncode == 0 else []
    if context not in names:
        raise InputError(
            f"no context {context!r} in the kubeconfig",
            key="--context",
            fix=f"use one of {', '.join(names)}" if names else "name a context of the kubeconfig",
        )


def read_cluster(kubectl: Kubectl, namespace: str | None) -> list[Row]:
    jobs = {resource: list_objects(kubectl, resource, namespace) for resource in APIS}
    pods = list_objects(kubectl, "pods", namespace) if any(jobs.values()) else []
    return rows(jobs, pods)


def format_table(found: Sequence[Row]) -> str:
    header = ("NAMESPACE", "RUN", "API", "PHASE", "STEP", "TOKENS/S", "ETA", "CHECKPOINT", "RESTARTS")

    def shown(value: Any) -> str:
        return "-" if value is None else str(value)

    table = [header] + [
        (
            r.namespace,
            r.run,
            r.api,
            r.phase,
            f"{shown(r.step)}/{shown(r.total_steps)}" if r.step is not None else "-",
            shown(r.tokens_per_second),
            shown(r.eta),
            shown(r.checkpoint),
            str(r.restarts),
        )
        for r in found
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    numeric = {4, 5, 7, 8}
    return "\n".join(
        "  ".join(
            c.rjust(w) if i in numeric and line is not header else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in table
    )


def check_kubeconfig(kubeconfig: str | None, environ: Mapping[str, str]) -> None:
    """Bad input when no kubeconfig kubectl would read exists (in a pod kubectl uses its service account)."""
    if kubeconfig is not None:
        if not Path(kubeconfig).is_file():
            raise InputError("no such file", file=kubeconfig, key="--kubeconfig", fix="name an existing kubeconfig")
        return
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return
    paths = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not paths:
        paths = [str(Path.home() / ".kube" / "config")]
    if not any(Path(p).is_file() for p in paths):
        raise InputError(
            f"no kubeconfig: {', '.join(paths)} not found",
            key="--kubeconfig",
            fix="pass --kubeconfig FILE or set KUBECONFIG",
        )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.option("--kubeconfig", metavar="FILE", default=None, help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config).")
@click.option("--context", metavar="NAME", default=None, help="Context of the kubeconfig (default: its current one).")
@click.option(
    "-n", "--namespace", metavar="NS", default=None, help="Only this namespace (default: every one holding runs)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="A table, or the rows as json for scripts, on stdout.",
)
@errors_to_exit_codes
def main(kubeconfig: str | None, context: str | None, namespace: str | None, fmt: str) -> None:
    """List every run of the cluster: job API, phase, step, tokens/s, ETA, last checkpoint, restarts."""
    check_kubeconfig(kubeconfig, os.environ)
    kubectl = kubectl_runner(kubeconfig, context)
    if context is not None:
        check_context(kubectl, context)
    found = read_cluster(kubectl, namespace)
    if fmt == "json":
        click.echo(json.dumps([asdict(r) for r in found], indent=2))
        return
    if not found:
        where = f"namespace {namespace}" if namespace else "any namespace"
        click.echo(f"no runs in {where} (objects labelled {RUN_SELECTOR})", err=True)
        return
    click.echo(format_table(found))


if __name__ == "__main__":
    main()
