"""Job templates hold what the API server's Job validation holds (k8s.io/kubernetes pkg/apis/batch/
validation): a Job's pods restart `Never` or `OnFailure` (the pod default `Always` is refused), and a Job
with a podFailurePolicy restarts `Never` (the policy judges each failed pod, which OnFailure would restart
in place). A template that breaks either is refused when it is applied, or, inside a JobSet or a Trainer
runtime, when the controller creates its Jobs: the run never starts. Every Job template is checked: Jobs,
CronJobs, JobSets' replicated Jobs and Kubeflow Trainer runtimes' replicated Jobs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from generators.validation.manifests import Doc, Problem, gvk
from generators.validation.semantics import Blame, reporter

JOB_RESTART_POLICIES = ("Never", "OnFailure")


def job_specs(data: Any) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """(keys, spec) of every Job spec an object holds."""
    group, kind = gvk(data)
    spec = data.get("spec") if isinstance(data.get("spec"), dict) else {}
    if (group, kind) == ("batch", "Job"):
        yield ("spec",), spec
    elif (group, kind) == ("batch", "CronJob"):
        yield ("spec", "jobTemplate", "spec"), ((spec.get("jobTemplate") or {}).get("spec") or {})
    elif (group, kind) == ("jobset.x-k8s.io", "JobSet") or (
        group == "trainer.kubeflow.org" and kind in ("ClusterTrainingRuntime", "TrainingRuntime")
    ):
        at: tuple[str, ...] = ("spec",)
        if group == "trainer.kubeflow.org":
            spec, at = ((spec.get("template") or {}).get("spec") or {}), ("spec", "template", "spec")
        for i, rjob in enumerate(spec.get("replicatedJobs") or []):
            job = ((rjob or {}).get("template") or {}).get("spec")
            if isinstance(job, dict):
                yield at + ("replicatedJobs", str(i), "template", "spec"), job


def check_job_templates(docs: Sequence[Doc], blame: Blame = lambda doc, keys: doc.file) -> list[Problem]:
    problems: list[Problem] = []
    for d in docs:
        if not isinstance(d.data, dict):
            continue
        bad = reporter(problems, d, blame)
        for at, job in job_specs(d.data):
            pod = ((job.get("template") or {}).get("spec")) or {}
            policy = pod.get("restartPolicy")
            keys = at + ("template", "spec", "restartPolicy")
            if policy not in JOB_RESTART_POLICIES:
                bad(
                    keys,
                    f"the Job's pods have restartPolicy {policy or 'unset (Always)'}, which the API server refuses "
                    "for a Job; fix: restartPolicy: Never (or OnFailure)",
                )
            elif job.get("podFailurePolicy") and policy != "Never":
                bad(
                    keys,
                    f"the Job has a podFailurePolicy and its pods restartPolicy {policy}, which the API server "
                    "refuses (the policy judges each failed pod); fix: restartPolicy: Never",
                )
    return problems
