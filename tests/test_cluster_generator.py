"""generators/cluster.py: eksctl ClusterConfigs (and Karpenter objects) from the matrix, checked
against eksctl's published schema and Karpenter's CRD schemas with real kubeconform."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from support import REPO_ROOT, cli_run, crd_schemas

from generators import cluster
from generators import matrix as matrix_mod
from generators.core.gotools import tool
from generators.matrix.schema import Cluster
from generators.plan import plan
from generators.render import provisioning
from tools.cluster import schemas

MATRIX = REPO_ROOT / "matrix.yaml"
RESERVATION = "cr-0123456789abcdef0"


def run_cli(*args: str) -> Result:
    return cli_run(cluster.main, list(args), catch_exceptions=False)


def kubeconform(location: str, *paths: Path) -> dict:
    """kubeconform -strict with one schema location; its JSON report."""
    proc = subprocess.run(
        [tool("kubeconform"), "-strict", "-summary", "-output", "json", "-schema-location", location, *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(proc.stdout)


def eksctl_report(*paths: Path) -> dict:
    eksctl_schemas = crd_schemas().parent / "eksctl"
    assert (eksctl_schemas / "clusterconfig_v1alpha5.json").is_file(), f"eksctl schema missing in {eksctl_schemas}"
    return kubeconform(f"{eksctl_schemas}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json", *paths)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def matrix_copy(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    text = MATRIX.read_text()
    assert text.count(old) >= count, f"matrix.yaml no longer contains {old!r}"
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace(old, new, count))
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("provisioning")
    result = run_cli(str(MATRIX), "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def generated_karpenter(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("provisioning-karpenter")
    result = run_cli(str(MATRIX), "--out", str(out), "--karpenter")
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.gotools
def test_every_cluster_of_the_matrix_gets_a_config_that_passes_the_eksctl_schema(generated):
    clusters = matrix_mod.load(str(MATRIX)).clusters
    configs = sorted(generated.glob("*/eksctl.yaml"))
    assert [p.parent.name for p in configs] == sorted(clusters)
    report = eksctl_report(*configs)
    assert report["summary"] == {"valid": len(clusters), "invalid": 0, "errors": 0, "skipped": 0}, report


@pytest.mark.gotools
def test_an_unknown_field_fails_the_eksctl_schema_naming_it(generated, tmp_path):
    config = load(generated / "fsdp-p5" / "eksctl.yaml")
    config["managedNodeGroups"][1]["efaEnabeld"] = True
    bad = tmp_path / "eksctl.yaml"
    bad.write_text(yaml.safe_dump(config))
    report = eksctl_report(bad)
    assert report["summary"]["invalid"] == 1, report
    assert "efaEnabeld" in report["resources"][0]["msg"]


@pytest.mark.gotools
def test_a_wrong_type_fails_the_eksctl_schema(generated, tmp_path):
    config = load(generated / "fsdp-p5" / "eksctl.yaml")
    config["managedNodeGroups"][1]["maxSize"] = "sixteen"
    bad = tmp_path / "eksctl.yaml"
    bad.write_text(yaml.safe_dump(config))
    assert eksctl_report(bad)["summary"]["invalid"] == 1


@pytest.mark.gotools
def test_the_repository_validation_checks_the_committed_configs_against_the_eksctl_schema():
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "generators" / "validate.py"),
            "--crd-schemas",
            str(crd_schemas()),
            "overlays/provisioning",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    output = result.stdout + result.stderr
    configs = len(list((REPO_ROOT / "overlays" / "provisioning").glob("*/eksctl.yaml")))
    assert result.returncode == 0 and configs >= 1, output
    assert f"{configs} resources" in output and "OK" in output, output


def test_a_bad_instance_type_in_the_matrix_fails_with_one_line_and_writes_nothing(tmp_path, cli):
    bad = matrix_copy(tmp_path, "instance_types: [p5.48xlarge]", "instance_types: [p5.96xlarge]")
    line = bad.read_text().splitlines().index("    instance_types: [p5.96xlarge]") + 1
    out = tmp_path / "out"
    result = cli(cluster.main, [str(bad), "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert (
        f"matrix.yaml:{line}: clusters.fsdp-p5.instance_types[0]: unknown instance type 'p5.96xlarge'" in result.stderr
    )
    assert "fix: use one of" in result.stderr
    assert not out.exists()


def test_gpu_node_groups_carry_efa_private_networking_zone_volume_and_the_largest_run(generated):
    m = matrix_mod.load(str(MATRIX))
    plans = [p for cp in plan(m, matrix_mod.expand(m)) for p in cp.runs]
    for name, c in m.clusters.items():
        groups = {g["name"]: g for g in load(generated / name / "eksctl.yaml")["managedNodeGroups"]}
        assert set(groups) == {"system"} | {provisioning.nodegroup_name(t) for t in c.instance_types}
        for itype in c.instance_types:
            g = groups[provisioning.nodegroup_name(itype)]
            largest = max(p.nodes for p in plans if p.cluster == name and p.instance_type == itype)
            assert (g["instanceType"], g["efaEnabled"], g["privateNetworking"]) == (itype, True, True)
            assert g["availabilityZones"] == [c.availability_zones[0]]
            assert g["volumeSize"] == c.volume_size_gib
            assert (g["minSize"], g["desiredCapacity"], g["maxSize"]) == (0, 0, largest)
            assert "capacityReservation" not in g
        assert groups["system"].get("efaEnabled") is None and "taints" not in groups["system"]


def test_the_gpu_taint_is_tolerated_by_the_pytorchjob_template(generated):
    job = load(REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml")
    tolerations = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"]
    for path in generated.glob("*/eksctl.yaml"):
        for g in load(path)["managedNodeGroups"]:
            for taint in g.get("taints", []):
                assert any(
                    t["key"] == taint["key"]
                    and t["effect"] == taint["effect"]
                    and (t["operator"] == "Exists" or t.get("value") == taint["value"])
                    for t in tolerations
                ), f"{path}: {taint} is not tolerated by base/pytorchjob"


@pytest.mark.gotools
def test_a_capacity_reservation_targets_the_node_group(tmp_path):
    m = matrix_copy(tmp_path, "capacity_reservation_ids: []", f"capacity_reservation_ids: [{RESERVATION}]", 2)
    out = tmp_path / "out"
    assert run_cli(str(m), "--out", str(out)).exit_code == 0
    group = load(out / "fsdp-p5" / "eksctl.yaml")["managedNodeGroups"][1]
    assert group["capacityReservation"] == {"capacityReservationTarget": {"capacityReservationID": RESERVATION}}
    assert eksctl_report(*out.glob("*/eksctl.yaml"))["summary"]["valid"] == 2


def test_two_reservations_for_a_node_group_fail_naming_the_line_and_the_way_out(tmp_path, cli):
    m = matrix_copy(
        tmp_path, "capacity_reservation_ids: []", f"capacity_reservation_ids: [{RESERVATION}, cr-0123456789abcdef1]"
    )
    line = next(i for i, text in enumerate(m.read_text().splitlines(), 1) if "cr-0123456789abcdef1" in text)
    out = tmp_path / "out"
    result = cli(cluster.main, [str(m), "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert (
        f"matrix.yaml:{line}: clusters.fsdp-p4de.capacity_reservation_ids: 2 capacity reservation(s)" in result.stderr
    )
    assert "generate with --karpenter" in result.stderr
    ok = cli(cluster.main, [str(m), "--out", str(out), "--karpenter"])
    assert ok.exit_code == 0, ok.stderr
    terms = load(out / "fsdp-p4de" / "karpenter" / "ec2nodeclass.yaml")["spec"]["capacityReservationSelectorTerms"]
    assert terms == [{"id": RESERVATION}, {"id": "cr-0123456789abcdef1"}]


@pytest.mark.gotools
def test_karpenter_replaces_the_gpu_node_groups_and_its_objects_pass_their_crd_schemas(generated_karpenter):
    m = matrix_mod.load(str(MATRIX))
    for name, c in m.clusters.items():
        config = load(generated_karpenter / name / "eksctl.yaml")
        assert [g["name"] for g in config["managedNodeGroups"]] == ["system"]
        assert config["karpenter"]["version"] == provisioning.KARPENTER_VERSION
        assert config["metadata"]["tags"][provisioning.DISCOVERY_TAG] == name
        pools = sorted((generated_karpenter / name / "karpenter").glob("nodepool-*.yaml"))
        assert [p.name for p in pools] == sorted(
            f"nodepool-{provisioning.nodegroup_name(t)}.yaml" for t in c.instance_types
        )
        pool = load(pools[0])["spec"]
        assert {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [c.availability_zones[0]]} in pool[
            "template"
        ]["spec"]["requirements"]
        assert pool["disruption"]["consolidationPolicy"] == "WhenEmpty"
    karpenter_files = sorted(generated_karpenter.glob("*/karpenter/*.yaml"))
    report = kubeconform(
        f"{crd_schemas()}/{{{{.Group}}}}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json", *karpenter_files
    )
    assert report["summary"] == {"valid": len(karpenter_files), "invalid": 0, "errors": 0, "skipped": 0}, report
    assert eksctl_report(*generated_karpenter.glob("*/eksctl.yaml"))["summary"]["valid"] == len(m.clusters)


def test_a_single_zone_gets_the_next_zone_for_the_control_plane():
    c = Cluster(
        name="c",
        namespace="fsdp",
        instance_types=("p5.48xlarge",),
        region="us-west-2",
        availability_zones=("us-west-2a",),
        capacity_reservation_ids=(),
        volume_size_gib=500,
        kubernetes_version="1.33",
        max_nodes=4,
        shared_storage_gib=100,
    )
    assert provisioning.cluster_zones(c) == ["us-west-2a", "us-west-2b"]
    two = Cluster(**{**c.__dict__, "availability_zones": ("us-west-2c", "us-west-2d")})
    assert provisioning.cluster_zones(two) == ["us-west-2c", "us-west-2d"]


def test_the_committed_definitions_are_up_to_date():
    result = run_cli(str(MATRIX), "--check")
    assert result.exit_code == 0, result.output + result.stderr


def test_check_names_a_hand_edited_file_and_write_restores_it(tmp_path):
    out = tmp_path / "out"
    assert run_cli(str(MATRIX), "--out", str(out)).exit_code == 0
    edited = out / "fsdp-p5" / "eksctl.yaml"
    original = edited.read_bytes()
    edited.write_text(edited.read_text().replace("maxSize: 4", "maxSize: 5"))
    result = run_cli(str(MATRIX), "--out", str(out), "--check")
    assert result.exit_code == 1
    assert f"differs: {out}/fsdp-p5/eksctl.yaml" in result.output
    assert "run: python generators/cluster.py" in result.stderr
    assert run_cli(str(MATRIX), "--out", str(out)).exit_code == 0
    assert edited.read_bytes() == original


def test_output_is_deterministic_banner_first_and_stale_clusters_pruned_but_other_generators_kept(tmp_path):
    out = tmp_path / "out"
    stale = out / "retired-cluster" / "eksctl.yaml"
    stale.parent.mkdir(parents=True)
    stale.write_text("# Generated by generators/cluster.py from matrix.yaml. Do not edit by hand:\nkind: x\n")
    other = out / "notes" / "kept.yaml"
    other.parent.mkdir()
    other.write_text("# Generated by generators/expand.py from matrix.yaml. Do not edit by hand:\nkind: y\n")
    assert run_cli(str(MATRIX), "--out", str(out)).exit_code == 0
    first = {p: p.read_bytes() for p in out.rglob("*.yaml")}
    assert not stale.exists() and not stale.parent.exists() and other.exists()
    assert run_cli(str(MATRIX), "--out", str(out)).exit_code == 0
    assert {p: p.read_bytes() for p in out.rglob("*.yaml")} == first
    for path, data in first.items():
        if path != other:
            assert data.startswith(b"# Generated by generators/cluster.py from matrix.yaml. Do not edit by hand:\n")
            assert data.isascii()


def test_out_pointing_at_a_file_is_bad_input(tmp_path, cli):
    target = tmp_path / "file"
    target.write_text("x")
    result = cli(cluster.main, [str(MATRIX), "--out", str(target)])
    assert result.exit_code == 2 and "is a file" in result.stderr and target.read_text() == "x"


def test_the_harness_runs_the_karpenter_release_the_generated_clusters_install() -> None:
    """tools/cluster/go/karpenter (Karpenter's core with the kwok provider, the harness's autoscaler)
    and tools/cluster/go/crds (the AWS provider whose CRDs the validation uses) pin KARPENTER_VERSION."""
    want = f"v{provisioning.KARPENTER_VERSION}"
    assert schemas.pinned_version(schemas.Source("karpenter", "sigs.k8s.io/karpenter", ()))[0] == want
    aws = schemas.Source("crds", "github.com/aws/karpenter-provider-aws", ())
    assert schemas.pinned_version(aws)[0] == want
