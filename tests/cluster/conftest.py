"""The real cluster parts for the tests under tests/cluster/ (tools/cluster/levels.py).

One control plane with the Training Operator and kwok serves levels 1 and 2; level 3 starts its own
with the Flux controllers, one per cluster of matrix.yaml. The session ends by checking that no
process the harness started and no port it handed out outlives it.
Under pytest-xdist each control plane's tests run on one worker (tests/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support import REPO_ROOT

from tools.cluster import dryrun, levels, processes, realpods
from tools.cluster.cluster import Cluster


@pytest.fixture(scope="session", autouse=True)
def nothing_outlives_the_suite() -> Iterator[None]:
    yield
    # Session fixtures that started clusters were torn down before this one (set up first, torn down last).
    left = processes.leftovers() + realpods.leftovers()
    processes.stop_all()
    assert left == [], f"the cluster harness left these behind: {left}"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = levels.start("operator")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def realpods_levels() -> Iterator[dict[str, Cluster]]:
    """Real-pods levels by their options, started on first use and stopped at the end of the session."""
    levels: dict[str, Cluster] = {}
    try:
        yield levels
    finally:
        for c in levels.values():
            c.stop()


def _options_key(module: object) -> str:
    return json.dumps(getattr(module, "REALPODS_OPTIONS", {}), sort_keys=True)


@pytest.fixture(scope="module")
def pods(request: pytest.FixtureRequest, realpods_levels: dict[str, Cluster]) -> Iterator[Cluster]:
    """The real-pods level with the module's REALPODS_OPTIONS (Cluster.start's options for level "pods"),
    shared by the modules that ask for the same options (they run on one worker, tests/conftest.py) and
    stopped after the last of them, so that levels with other options do not stay up beside the next;
    skips in one line where the machine lacks root, namespaces or cgroups."""
    reason = realpods.unavailable()
    if reason:
        pytest.skip(reason)
    key = _options_key(request.module)
    if key not in realpods_levels:
        realpods_levels[key] = levels.start("pods", **getattr(request.module, "REALPODS_OPTIONS", {}))
    yield realpods_levels[key]
    # Modules run in collection order on their worker: a later module with the same options reuses it.
    items = request.session.items
    last = max(i for i, item in enumerate(items) if item.module is request.module)
    if not any("pods" in item.fixturenames and _options_key(item.module) == key for item in items[last + 1 :]):
        level = realpods_levels.pop(key, None)  # a module may have stopped it already
        if level is not None:
            level.stop()


@pytest.fixture(scope="module")
def kcluster() -> Iterator[Cluster]:
    """The operator level with Kueue as the repository ships it, then fsdp-p5's configs (run namespace,
    queues, shared volume) as infra-configs applies them after infra-controllers, a CPU node and two
    p5.48xlarge nodes. The configs' Jobs (NCCL pre-flight) are left out: they would take quota from the
    runs under test. One per module that asks for it."""
    c = levels.start("operator", kueue="fsdp-p5")
    try:
        path = "overlays/infrastructure/fsdp-p5/configs"
        docs = [d for d in dryrun.render(REPO_ROOT, path) if d["kind"] != "Job"]
        dryrun.ensure_namespaces(c, {path: docs})
        c.apply(docs)
        (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
        c.add_shared_volume(pvc)
        c.add_cpu_node()
        c.add_gpu_nodes("p5.48xlarge", 2)
        yield c
    finally:
        c.stop()
