"""The per-cluster NCCL pre-flight Jobs the generator writes (generators/render/preflight.py over
base/preflight): one per GPU instance type, built with the real kustomize, matching the instance
catalog, the pre-flight program's command line and the alert that watches them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from matrix_support import cluster_plans
from support import REPO_ROOT

from generators.core.gotools import tool
from generators.render.layout import layout_for
from generators.render.preflight import MIN_BUSBW_FRACTION, render_preflight
from trainer.catalog import INSTANCE_TYPES
from trainer.preflight import parse_args

RULES = REPO_ROOT / "base" / "monitoring" / "configs" / "prometheusrule-fsdp.yaml"
# A cluster with an EFA instance type of each P5 network generation and a P4.
MATRIX = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository:
  url: https://github.com/example-org/fsdp-gitops
  branch: main
clusters:
  fsdp-mixed:
    region: us-east-1
    availability_zones: [us-east-1a]
    instance_types: [p4d.24xlarge, p5en.48xlarge]
    namespace: research
defaults:
  cluster: fsdp-mixed
  instance_type: p5en.48xlarge
  trainer:
    data:
      path: /shared/data/samsum/train.jsonl
axes:
  model: [llama2-7b]
  nodes: [2]
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """{instance type: {kind: object}} from `kustomize build` of each generated pre-flight overlay."""
    out = tmp_path_factory.mktemp("overlays")
    (plan,) = cluster_plans(MATRIX)
    files = render_preflight(plan.cluster, layout_for(out, REPO_ROOT))  # reaches base/ from out
    result = {}
    for type_name in plan.cluster.instance_types:
        d = out / "infrastructure" / "fsdp-mixed" / "configs" / f"preflight-{INSTANCE_TYPES[type_name].family}"
        d.mkdir(parents=True)
        for path, doc in files.items():
            if Path(path).parent == d.relative_to(out):
                (d / Path(path).name).write_text(yaml.safe_dump(list(doc.ops) if hasattr(doc, "ops") else doc))
        proc = subprocess.run(
            [tool("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(d)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        result[type_name] = {doc["kind"]: doc for doc in yaml.safe_load_all(proc.stdout) if doc}
    return result


@pytest.mark.gotools
def test_one_job_per_instance_type_with_the_catalog_resources(built):
    assert sorted(built) == ["p4d.24xlarge", "p5en.48xlarge"]
    for type_name, objs in built.items():
        instance = INSTANCE_TYPES[type_name]
        job, svc = objs["Job"], objs["Service"]
        name = f"fsdp-preflight-{instance.family}"
        assert job["metadata"]["name"] == svc["metadata"]["name"] == name
        assert job["metadata"]["namespace"] == svc["metadata"]["namespace"] == "research"
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
            "Indexed",
            2,
            2,
            4,
        )
        # Retries only for a check that could not run; its verdict (exit 3) fails the Job at once.
        fail, ignore = spec["podFailurePolicy"]["rules"]
        assert fail == {
            "action": "FailJob",
            "onExitCodes": {"containerName": "preflight", "operator": "In", "values": [3]},
        }
        assert ignore["action"] == "Ignore" and ignore["onPodConditions"][0]["type"] == "DisruptionTarget"
        assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": type_name}
        (c,) = pod["containers"]
        want = {"nvidia.com/gpu": instance.num_gpus, "vpc.amazonaws.com/efa": instance.num_efa}
        assert c["resources"]["limits"] == c["resources"]["requests"] == want
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
        # Pod 0 is reachable as <job>-0.<service>: the subdomain is the headless Service, which
        # selects the Job's pods before they are ready.
        assert pod["subdomain"] == name and svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
        assert svc["spec"]["publishNotReadyAddresses"] is True
        anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["topologyKey"] == "kubernetes.io/hostname"
        assert "trainer:" in c["image"]


@pytest.mark.gotools
def test_command_is_the_preflight_program_with_the_catalog_minimum(built):
    for type_name, objs in built.items():
        instance = INSTANCE_TYPES[type_name]
        (c,) = objs["Job"]["spec"]["template"]["spec"]["containers"]
        cmd = c["command"]
        name = objs["Job"]["metadata"]["name"]
        assert cmd[:4] == ["python", "-m", "trainer.launch", "--nnodes=2"]
        assert f"--nproc_per_node={instance.num_gpus}" in cmd
        assert f"--rdzv-endpoint={name}-0.{name}:29400" in cmd
        module = cmd.index("trainer.preflight")
        assert cmd[module - 1] == "-m"
        args = parse_args(cmd[module + 1 :])  # the program accepts exactly these arguments
        assert args.expect_transport == "efa"
        assert args.min_busbw_gbs == pytest.approx(MIN_BUSBW_FRACTION * instance.network_gbps / 8)
        assert args.min_busbw_gbs > 0


def test_the_alert_watches_the_generated_job_names():
    (plan,) = cluster_plans(MATRIX)
    files = render_preflight(plan.cluster, layout_for(REPO_ROOT / "overlays", REPO_ROOT))
    names = {
        op["value"] for doc in files.values() if hasattr(doc, "ops") for op in doc.ops if op["path"] == "/metadata/name"
    }
    assert names == {"fsdp-preflight-p4d", "fsdp-preflight-p5en"}
    rules = [r for g in yaml.safe_load(RULES.read_text())["spec"]["groups"] for r in g["rules"]]
    (rule,) = [r for r in rules if r.get("alert") == "FsdpNcclPreflightFailed"]
    pattern = re.search(r'job_name=~"([^"]+)"', rule["expr"]).group(1)
    assert all(re.fullmatch(pattern, n) for n in names)  # Prometheus anchors regex matchers
