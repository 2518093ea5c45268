"""docs/validation.md and tests/README.md describe the harness's levels exactly as tools/cluster/levels.py
names them: the same levels with the same steps in the same order, and the same options with the steps
they add (both documents carry the two tables after the same marker)."""

from __future__ import annotations

import re

import pytest
from support import REPO_ROOT

from tools.cluster import levels

DOCS = ("docs/validation.md", "tests/README.md")
MARKER = "<!-- The levels as tools/cluster/levels.py names them"
ROW = re.compile(r"^\| `([a-z-]+)` \| ([a-z, -]+) \|$")


def tables(text: str) -> list[dict[str, tuple[str, ...]]]:
    """The two tables after the marker: [{level: steps}, {option: steps}]."""
    start = text.index(MARKER)
    found: list[dict[str, tuple[str, ...]]] = []
    current: dict[str, tuple[str, ...]] | None = None
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|---"):
            current = {}
            found.append(current)
        elif (m := ROW.match(line)) and current is not None:
            current[m.group(1)] = tuple(s.strip() for s in m.group(2).split(","))
        elif line.startswith("|") or not line.strip():
            continue
        else:
            break
        if len(found) == 2 and not line.strip():
            break
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_the_document_names_the_levels_as_the_levels_module_does(doc: str) -> None:
    text = (REPO_ROOT / doc).read_text()
    assert MARKER in text, f"{doc} lacks the levels tables"
    got = tables(text)
    assert got[0] == levels.LEVELS, f"{doc}: the levels table differs from levels.LEVELS"
    assert got[1] == levels.ADD_ONS, f"{doc}: the options table differs from levels.ADD_ONS"


def test_the_check_reads_a_changed_table() -> None:
    text = (REPO_ROOT / DOCS[0]).read_text().replace("| `api` | pki, hosts,", "| `api` | pki,", 1)
    assert tables(text)[0]["api"] != levels.LEVELS["api"]


def test_every_step_a_level_names_exists_and_options_are_checked() -> None:
    named = {s for steps in (*levels.LEVELS.values(), *levels.ADD_ONS.values()) for s in steps}
    assert named == set(levels.STEPS)
    with pytest.raises(ValueError, match="takes no option 'gpu_nodes'"):
        levels.steps("operator", gpu_nodes=2)
    with pytest.raises(ValueError, match="takes no option 'flux'"):
        levels.steps("operator", flux=True)
    with pytest.raises(ValueError, match="takes no option 'karpenter'"):  # real kubelets, no kwok to play its nodes
        levels.steps("pods", karpenter=True)
    assert levels.steps("operator", kueue=True, karpenter=True)[-2:] == ["kueue", "karpenter"]
    assert "training-operator" not in levels.steps("pods", flux=True)
    assert levels.steps("operator", trainjob=True, kueue=True)[-2:] == ["kueue", "kubeflow-trainer"]
