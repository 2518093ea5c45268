"""Suite-wide: the `cli` fixture (the one in-process CLI runner, tests/support.py's cli_run), and how
pytest-xdist (`-n auto`, as tools/test.sh runs the suite) shares the tests out.

Each test module goes to one worker as a whole, so that its expensive module fixtures (trained tiny
models, started servers) are set up once. Under tests/cluster/ the units follow the control planes
instead: levels 1 and 2 share one ("cluster"), and each level-3 cluster of matrix.yaml has its own
("flux-<cluster>", from the test's parameter), so each starts once, on one worker.

(xdist's own `--dist loadgroup` renames node ids to carry the group, which pytest 9 no longer allows,
so the grouping is a scheduler here.)
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from click.testing import Result
from support import cli_run

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # plain pytest: nothing to share out
    LoadScopeScheduling = None


@pytest.fixture(scope="session")
def cli() -> Callable[..., Result]:
    """The one CLI runner: `cli(main, [args...])` runs a Click command in this process (support.cli_run)."""
    return cli_run


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or its control plane under tests/cluster/."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/cluster/"):
        if path.startswith("tests/cluster/test_realpods_"):
            # Real containers: every real-pods module is one unit, run by one worker, one level at a
            # time (a level is stopped after the last module with its options). Two levels side by side
            # on 2 CPUs slowed both and broke their timing; in one unit they follow each other while
            # the other workers run the rest.
            return "realpods"
        if path.endswith("test_cluster_kueue.py"):
            return "kueue"  # a control plane of its own: its Kueue webhooks would hold the others' runs
        if path.endswith("test_cluster_flux_trainjob.py"):
            return "flux-trainjob"  # its own control plane, with the Trainer and JobSet controllers
        if path.endswith("test_cluster_flux.py"):
            param = re.search(r"\[([^\]]+)\]$", nodeid)
            return f"flux-{param.group(1)}" if param else "flux"
        return "cluster"
    return path


# The units that take minutes, handed out first in this order: the real-pods chain (the longest), then
# the control planes. xdist's own order (by number of tests) put the three kwok Flux units last, where
# they ran side by side while the workers' other work had ended: the Flux broken-commit test took 134-144 s
# there against 15 s alone. Behind them the modules with `slow` tests (torchrun, kill-and-restart loops),
# then the quick ones, each group by number of tests as xdist orders them, so the end is quick modules.
LONG_UNITS = ("realpods", "flux-fsdp-p4de", "cluster", "flux-trainjob", "kueue", "flux-fsdp-p5")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Units in the order above, each keeping its tests' order (module fixtures)."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)

    def order(unit: str) -> tuple[int, int, int]:
        if unit in LONG_UNITS:
            return (0, LONG_UNITS.index(unit), 0)
        slow = any(item.get_closest_marker("slow") for item in units[unit])
        return (1 if slow else 2, 0, -len(units[unit]))

    items[:] = [item for unit in sorted(units, key=order) for item in units[unit]]


if LoadScopeScheduling is not None:

    class _ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    @pytest.hookimpl(optionalhook=True)  # `-p no:xdist` leaves the hook without a spec
    def pytest_xdist_make_scheduler(config, log):
        config.option.loadscopereorder = False  # units in collection order: LONG_UNITS first
        return _ByUnit(config, log)
