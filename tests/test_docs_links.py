"""Every relative link in the documentation (README.md, docs/**/*.md, benchmarks/README.md) reaches a
file or folder of the repository, and every #anchor a heading of its target, by GitHub's rule for
heading ids: the heading's text lowercased, punctuation dropped, spaces made hyphens, a repeated
id suffixed -1, -2, ..."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

PAGES = sorted(
    [REPO_ROOT / "README.md", REPO_ROOT / "benchmarks" / "README.md", *(REPO_ROOT / "docs").rglob("*.md")],
    key=lambda p: p.as_posix(),
)

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target may be <...> and may carry a "title".
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)(?:\s+\"[^\"]*\")?\s*\)"
)
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
HTML_ID = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif fence == match.group(1):
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's id of a heading: of its rendered text (links as their text, no code or emphasis marks)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        found.update(HTML_ID.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link on the page, code aside."""
    out = []
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        without_code = CODE_SPAN.sub("", line)
        for target in INLINE_LINK.findall(without_code):
            out.append((number, target.strip("<>")))
        match = REFERENCE_DEFINITION.match(without_code)
        if match:
            out.append((number, match.group(1).strip("<>")))
    return out


def broken_links(page: Path) -> list[str]:
    """One line per link of `page` that does not resolve: the page, the line, the target and why."""
    problems = []
    shown = page.relative_to(REPO_ROOT).as_posix()
    for number, target in links(page):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # a web address: not this repository's to check
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        where = f"{shown}:{number}: {target}"
        if not destination.is_relative_to(REPO_ROOT):
            problems.append(f"{where}: leaves the repository")
        elif not destination.exists():
            problems.append(f"{where}: {destination.relative_to(REPO_ROOT).as_posix()} does not exist")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{where}: no heading #{anchor} in {destination.relative_to(REPO_ROOT).as_posix()}")
        elif anchor and destination.suffix != ".md":
            problems.append(f"{where}: an anchor into a file that is not Markdown")
    return problems


def test_the_pages_are_found():
    names = {p.relative_to(REPO_ROOT).as_posix() for p in PAGES}
    assert {"README.md", "benchmarks/README.md", "docs/matrix.md", "docs/trainer.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path):
    assert broken_links(page) == []


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Launching, staging data, exit statuses, resuming", "launching-staging-data-exit-statuses-resuming"),
        (
            "Other models and batch sizes, and where `auto` draws its line",
            "other-models-and-batch-sizes-and-where-auto-draws-its-line",
        ),
        ("What the trainer's series mean, and how to sum them", "what-the-trainers-series-mean-and-how-to-sum-them"),
        ("Queueing with Kueue (on by default)", "queueing-with-kueue-on-by-default"),
        (
            "Two NVIDIA H200s: bf16, fp8, strategies, against FSDP1",
            "two-nvidia-h200s-bf16-fp8-strategies-against-fsdp1",
        ),
        ("The `--plan` table of [matrix.yaml](../matrix.yaml)", "the---plan-table-of-matrixyaml"),
        ("snake_case and **bold**", "snake_case-and-bold"),
    ],
)
def test_heading_ids_follow_github(heading: str, expected: str):
    assert slug(heading) == expected


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#two-words) [ok](docs/a.md#two-words-1) [ok](docs/) [web](https://example.com/x.md#y)\n"
        "```\n[in code](missing.md)\n```\n"
        "`[in a span](missing.md)` [self](#title-here)\n"
        "[gone](docs/b.md) [anchor](docs/a.md#three-words) [out](../outside.md)\n"
        "# Title here\n"
    )
    assert broken_links(page) == [
        "README.md:6: docs/b.md: docs/b.md does not exist",
        "README.md:6: docs/a.md#three-words: no heading #three-words in docs/a.md",
        "README.md:6: ../outside.md: leaves the repository",
    ]
