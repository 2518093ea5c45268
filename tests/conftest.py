"""Suite-wide: the `cli` fixture (the one in-process CLI runner, tests/support.py's cli_run), and how
pytest-xdist (`-n auto`, as tools/test.sh runs the suite) shares the tests out.

Each unit of work (tests/scheduling_support.py: a test module, or under tests/cluster/ what the module
uses: the shared control plane, the real-pods chain, one Flux environment per cluster of matrix.yaml)
goes to one worker as a whole, so that what it starts is started once, on one worker.

(xdist's own `--dist loadgroup` renames node ids to carry the group, which pytest 9 no longer allows,
so the grouping is a scheduler here.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

# pytest rewrites the asserts of test modules and conftests only: a support module's assert (a helper's
# check of a pod, a run, a command's exit) would fail with its message alone, without the values that
# explain it (a command's output). So each is registered before anything imports it.
pytest.register_assert_rewrite(*sorted(p.stem for p in Path(__file__).parent.rglob("*support.py")))

from click.testing import Result  # noqa: E402
from scheduling_support import CLUSTER_TESTS, LONG_UNITS, unit_of  # noqa: E402
from support import cli_run  # noqa: E402

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # plain pytest: nothing to share out
    LoadScopeScheduling = None


@pytest.fixture(scope="session")
def cli() -> Callable[..., Result]:
    """The one CLI runner: `cli(main, [args...])` runs a Click command in this process (support.cli_run)."""
    return cli_run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Units in this order, each keeping its tests' order (module fixtures): the units that take minutes
    (LONG_UNITS), the other units under tests/cluster/ (each starts a control plane, real processes or
    mounts of its own), then the modules with `slow` tests (torchrun, kill-and-restart loops), then the
    quick ones, each group by number of tests as xdist orders them, so that the end is quick modules."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)

    def order(unit: str) -> tuple[int, int, int]:
        if unit in LONG_UNITS:
            return (0, LONG_UNITS.index(unit), 0)
        if unit.startswith(CLUSTER_TESTS):
            return (1, 0, -len(units[unit]))
        slow = any(item.get_closest_marker("slow") for item in units[unit])
        return (2 if slow else 3, 0, -len(units[unit]))

    items[:] = [item for unit in sorted(units, key=order) for item in units[unit]]


if LoadScopeScheduling is not None:

    class _ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    @pytest.hookimpl(optionalhook=True)  # `-p no:xdist` leaves the hook without a spec
    def pytest_xdist_make_scheduler(config, log):
        config.option.loadscopereorder = False  # units in collection order: LONG_UNITS first
        return _ByUnit(config, log)
