"""How pytest-xdist shares the suite out (tests/scheduling_support.py): each test's unit follows what its
module uses, read from the module's source, and the long units come from matrix.yaml's clusters."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from scheduling_support import FLUX, LONG_UNITS, long_units, matrix_clusters, unit_of
from support import REPO_ROOT

# Modules of tests/cluster/ that start something of their own (a control plane, real processes as root,
# mounts) or nothing: each is a unit of its own, not the shared control plane's worker.
OWN_UNITS = [
    "tests/cluster/test_deploy_shared_storage_realpods.py",
    "tests/cluster/test_expand_mount_points.py",
    "tests/cluster/test_cluster_progress.py",
    "tests/cluster/test_trainer_launch_late_host.py",
    "tests/cluster/test_trainer_storage_tmpfs.py",
    "tests/cluster/test_trainer_full_disk.py",
    "tests/cluster/test_quickstart_without_root.py",
    "tests/cluster/test_cluster_gpu_health.py",
    "tests/cluster/test_cluster_block_queue.py",
    "tests/cluster/test_cluster_trainjob.py",
    "tests/cluster/test_cluster_kueue.py",
    "tests/cluster/test_cluster_flux_trainjob.py",
    "tests/cluster/test_cluster_processes.py",
]
SHARED_CONTROL_PLANE = [
    "tests/cluster/test_cluster_api_acceptance.py",
    "tests/cluster/test_cluster_operator.py",
    "tests/cluster/test_cluster_status.py",
    "tests/cluster/test_observability_cluster.py",
]
REAL_PODS = [
    "tests/cluster/test_realpods_level.py",
    "tests/cluster/test_realpods_runs.py",
    "tests/cluster/test_realpods_trainjob.py",
    "tests/cluster/test_realpods_flux.py",
]


@pytest.mark.parametrize("module", OWN_UNITS)
def test_a_module_that_starts_its_own_is_its_own_unit(module: str) -> None:
    assert unit_of(f"{module}::test_x") == module


@pytest.mark.parametrize("module", SHARED_CONTROL_PLANE)
def test_a_module_that_takes_the_shared_control_plane_is_in_its_unit(module: str) -> None:
    assert unit_of(f"{module}::test_x") == "cluster"


@pytest.mark.parametrize("module", REAL_PODS)
def test_a_module_that_takes_the_real_pods_level_is_in_the_realpods_chain(module: str) -> None:
    assert unit_of(f"{module}::test_x") == "realpods"


def test_outside_tests_cluster_the_unit_is_the_module() -> None:
    assert unit_of("tests/test_realpods_prune.py::test_x") == "tests/test_realpods_prune.py"
    assert unit_of("tests/test_matrix_load.py::test_x[fsdp-p5]") == "tests/test_matrix_load.py"


def test_the_flux_environments_are_one_unit_per_cluster_of_the_matrix_and_all_long() -> None:
    clusters = matrix_clusters()
    units = [unit_of(f"{FLUX}::test_flux_reconciles_the_cluster_until_everything_is_ready[{c}]") for c in clusters]
    assert len(set(units)) == len(clusters) >= 1
    assert set(units) <= set(LONG_UNITS)
    # The real-pods chain first, then one cluster's Flux environment before the shared control plane.
    assert LONG_UNITS[:3] == ("realpods", units[0], "cluster")


def test_renamed_clusters_keep_their_scheduling(tmp_path: Path) -> None:
    """The cluster names are matrix.yaml's: a renamed or added cluster is a Flux unit like the others."""
    matrix = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    matrix["clusters"] = {f"renamed-{i}": c for i, c in enumerate(matrix["clusters"].values())}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    (tmp_path / "tests" / "cluster").mkdir(parents=True)
    (tmp_path / FLUX).write_text((REPO_ROOT / FLUX).read_text())
    clusters = matrix_clusters(tmp_path / "matrix.yaml")
    assert clusters == tuple(sorted(matrix["clusters"]))
    order = long_units(clusters)
    for name in clusters:
        unit = unit_of(f"{FLUX}::test_x[{name}]", root=tmp_path)
        assert unit == f"{FLUX}[{name}]" and unit in order
    assert unit_of(f"{FLUX}::test_x[fsdp-p5]", root=tmp_path) == FLUX  # not a cluster any more
    assert long_units(("a", "b", "c")) == (
        "realpods",
        f"{FLUX}[a]",
        "cluster",
        "tests/cluster/test_cluster_flux_trainjob.py",
        "tests/cluster/test_cluster_kueue.py",
        f"{FLUX}[b]",
        f"{FLUX}[c]",
    )


@pytest.mark.parametrize(
    ("source", "unit"),
    [
        ("def test_a(cluster):\n    pass\n", "cluster"),
        ("@pytest.fixture\ndef pool(cluster):\n    yield\n\ndef test_a(pool):\n    pass\n", "cluster"),
        ("pytestmark = pytest.mark.usefixtures('pods')\n\ndef test_a():\n    pass\n", "realpods"),
        ("def test_a(pods, cluster):\n    pass\n", "realpods"),
        # A fixture of the module's own by the shared name is not the shared one.
        ("@pytest.fixture\ndef cluster():\n    yield\n\ndef test_a(cluster):\n    pass\n", "own"),
        # A helper's argument is not a fixture.
        ("def pods(cluster, job):\n    pass\n\ndef test_a(kcluster):\n    pass\n", "own"),
        # A fixture imported from a support module: what it takes counts, unless the module has its own.
        ("from x_support import pool\n\ndef test_a(pool):\n    pass\n", "cluster"),
        (
            "from x_support import pool\n\n@pytest.fixture\ndef cluster():\n    yield\n\ndef test_a(pool):\n    pass\n",
            "own",
        ),
    ],
)
def test_the_unit_follows_the_fixtures_the_module_takes(tmp_path: Path, source: str, unit: str) -> None:
    folder = tmp_path / "tests" / "cluster"
    folder.mkdir(parents=True)
    (tmp_path / "matrix.yaml").write_text("clusters: {c1: {}}\n")
    (folder / "x_support.py").write_text("@pytest.fixture\ndef pool(cluster):\n    yield\n")
    (folder / "test_m.py").write_text("import pytest\n\n" + textwrap.dedent(source))
    got = unit_of("tests/cluster/test_m.py::test_a", root=tmp_path)
    assert got == ("tests/cluster/test_m.py" if unit == "own" else unit)
