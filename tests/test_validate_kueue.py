"""Rule: Kueue is scoped to the runs' namespace and to the job kinds the repository queues
(generators/validation/kueue.py).

The repository's own Kueue HelmRelease and a generated cluster's namespace and LocalQueue pass; then
one mistake at a time, each refused with the file and the fix: the chart's default values (the
mutation that reverts the fix), no namespace selector, the upstream default selector, an empty one,
the pod-based frameworks, manageJobsWithoutQueueName, the runs' kind missing, and a run namespace the
selector does not select (or a namespace selected without a LocalQueue).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from generators.core.yamlio import Doc
from generators.matrix.load import load
from generators.matrix.schema import Cluster
from generators.render.flux import KUEUE_NAMESPACE_LABEL, run_namespace
from generators.validation.kueue import (
    CONFIG_KEYS,
    QUEUED,
    check_kueue_scope,
    check_kueue_values,
    kueue_config,
    selector_matches,
)
from generators.validation.semantics import Blame

RELEASE_FILE = "base/components/kueue/controller/release.yaml"
# The chart's own default (charts/kueue/values.yaml of sigs.k8s.io/kueue v0.16.2), less the comments.
UPSTREAM_DEFAULT = """\
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
webhook:
  port: 9443
integrations:
  frameworks: [batch/job, kubeflow.org/mpijob, ray.io/rayjob, kubeflow.org/pytorchjob, pod, deployment, statefulset]
"""


def release() -> dict[str, Any]:
    docs = list(yaml.safe_load_all((REPO_ROOT / RELEASE_FILE).read_text()))
    (hr,) = [d for d in docs if d["kind"] == "HelmRelease"]
    return hr


def with_config(**changes: Any) -> dict[str, Any]:
    """The repository's release with top-level Configuration fields changed (None deletes one)."""
    hr = copy.deepcopy(release())
    cfg, why = kueue_config(hr)
    assert cfg is not None, why
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    hr["spec"]["values"]["managerConfig"]["controllerManagerConfigYaml"] = yaml.safe_dump(cfg)
    return hr


def problems_of(hr: dict[str, Any]) -> list[str]:
    return [str(p) for p in check_kueue_values([Doc(hr, RELEASE_FILE, 18)])]


def test_the_repository_release_is_scoped():
    assert problems_of(release()) == []
    cfg, _ = kueue_config(release())
    assert cfg is not None
    assert set(cfg["integrations"]["frameworks"]) <= set(QUEUED)
    assert "kubeflow.org/pytorchjob" in cfg["integrations"]["frameworks"]
    assert cfg["managedJobsNamespaceSelector"] == {"matchLabels": dict([KUEUE_NAMESPACE_LABEL])}


def test_the_chart_defaults_are_refused():
    # The mutation that reverts the fix: the HelmRelease as it was, without values.
    hr = copy.deepcopy(release())
    del hr["spec"]["values"]
    (msg,) = problems_of(hr)
    assert msg.startswith(f"{RELEASE_FILE}:18: HelmRelease/kueue-system/kueue: sets no managerConfig")
    assert "every namespace" in msg and "fix:" in msg
    hr["spec"]["values"] = {"managerConfig": {"controllerManagerConfigYaml": UPSTREAM_DEFAULT}}
    found = problems_of(hr)
    assert any("sets no managedJobsNamespaceSelector" in p for p in found), found
    assert any("lists kubeflow.org/mpijob, ray.io/rayjob, pod, deployment, statefulset" in p for p in found), found


@pytest.mark.parametrize(
    "selector, system",
    [
        # Kueue's own default (apis/config/v1beta2/defaults.go): every namespace but two.
        (
            {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": ["kube-system", "kueue-system"],
                    }
                ]
            },
            "monitoring",
        ),
        ({}, "kube-system"),
        (
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["fsdp", "monitoring"]}
                ]
            },
            "monitoring",
        ),
    ],
)
def test_a_selector_that_reaches_system_namespaces_is_refused(selector, system):
    (msg,) = problems_of(with_config(managedJobsNamespaceSelector=selector))
    assert "selects system namespaces" in msg and system in msg and "fix:" in msg


def test_a_missing_selector_is_refused():
    (msg,) = problems_of(with_config(managedJobsNamespaceSelector=None))
    assert "sets no managedJobsNamespaceSelector" in msg


def test_frameworks_beyond_the_queued_kinds_are_refused():
    (msg,) = problems_of(with_config(integrations={"frameworks": ["kubeflow.org/pytorchjob", "batch/job", "pod"]}))
    assert "lists pod" in msg and "failurePolicy Fail" in msg
    (msg,) = problems_of(with_config(integrations=None))
    assert "sets no integrations.frameworks" in msg
    (msg,) = problems_of(with_config(integrations={"frameworks": ["batch/job"]}))
    assert "lacks kubeflow.org/pytorchjob" in msg


def test_manage_jobs_without_queue_name_is_refused():
    (msg,) = problems_of(with_config(manageJobsWithoutQueueName=True))
    assert "manageJobsWithoutQueueName: true" in msg


def test_broken_configuration_yaml_is_refused():
    hr = copy.deepcopy(release())
    hr["spec"]["values"]["managerConfig"]["controllerManagerConfigYaml"] = "kind: [unclosed"
    (msg,) = problems_of(hr)
    assert "is not YAML" in msg
    assert CONFIG_KEYS[-1] == "controllerManagerConfigYaml"


def test_selector_semantics():
    labels = {"kubernetes.io/metadata.name": "fsdp", "fsdp-gitops/kueue": "managed"}
    assert selector_matches({"matchLabels": {"fsdp-gitops/kueue": "managed"}}, labels)
    assert not selector_matches({"matchLabels": {"fsdp-gitops/kueue": "managed"}}, {"kubernetes.io/metadata.name": "x"})
    assert selector_matches({"matchExpressions": [{"key": "fsdp-gitops/kueue", "operator": "Exists"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, labels)


def cluster_units(namespace: dict[str, Any], queue_ns: str) -> list[tuple[str, list[Doc], Blame]]:
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "fsdp", "namespace": queue_ns},
        "spec": {"clusterQueue": "fsdp"},
    }
    monitoring = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}

    def blame(doc: Doc, keys: tuple[str, ...]) -> str:
        return doc.file

    return [
        ("overlays/infrastructure/c1/controllers", [Doc(release(), "overlays/infrastructure/c1/controllers")], blame),
        (
            "overlays/infrastructure/c1/configs",
            [Doc(d, "overlays/infrastructure/c1/configs", 3) for d in (namespace, local_queue, monitoring)],
            blame,
        ),
    ]


def _cluster(kueue: bool) -> Cluster:
    first = next(iter(load(str(REPO_ROOT / "matrix.yaml")).clusters.values()))
    return dataclasses.replace(first, kueue=kueue)


def test_the_generated_run_namespace_is_the_one_kueue_selects():
    ns = run_namespace(_cluster(True))
    assert check_kueue_scope(cluster_units(ns, ns["metadata"]["name"])) == []
    # Without Kueue the namespace carries no Kueue label.
    assert KUEUE_NAMESPACE_LABEL[0] not in run_namespace(_cluster(False))["metadata"]["labels"]


def test_a_run_namespace_without_the_label_is_reported():
    ns = run_namespace(_cluster(False))  # the label is missing
    (p,) = check_kueue_scope(cluster_units(ns, ns["metadata"]["name"]))
    assert p.obj == "Namespace/fsdp" and "never queued" in p.message and "LocalQueue/fsdp/fsdp" in p.message
    assert "cluster c1" in p.message and p.file == "overlays/infrastructure/c1/configs" and p.line == 3


def test_a_selected_namespace_without_a_local_queue_is_reported():
    ns = run_namespace(_cluster(True))
    (p,) = check_kueue_scope(cluster_units(ns, "elsewhere"))
    assert p.obj == "Namespace/fsdp" and "holds no LocalQueue" in p.message
