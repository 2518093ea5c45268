"""Where the output directory sits in the repository, so generated files reach base/ under any --out.

Generated overlays refer to the repository in two ways: kustomize resources relative to the file
that names them (`../../../../base/...` from overlays/infrastructure/<c>/controllers/), and Flux
Kustomization paths relative to the repository root (`./overlays/...`). Both follow from the output
directory's place, so every renderer asks a Layout instead of assuming overlays/.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    # The repository root relative to the output directory (posix), e.g. ".." for overlays/.
    root_from_out: str
    # The output directory relative to the repository root (posix), e.g. "overlays"; starts with
    # ".." when the output lies outside the repository (then Flux paths are only for local builds).
    out_from_root: str

    def to_repo(self, from_dir: str, repo_path: str) -> str:
        """`repo_path` (relative to the repository root) as seen from `from_dir` (relative to the output
        directory), for kustomize `resources`."""
        depth = len([p for p in from_dir.split("/") if p])
        return posixpath.normpath(posixpath.join(*([".."] * depth), self.root_from_out, repo_path))

    def flux_path(self, out_path: str) -> str:
        """`out_path` (relative to the output directory) as a Flux Kustomization path: from the
        repository root, starting with ./"""
        return "./" + posixpath.normpath(posixpath.join(self.out_from_root, out_path))


OVERLAYS = Layout(root_from_out="..", out_from_root="overlays")


def layout_for(out_dir: Path, repo_root: Path) -> Layout:
    """The Layout of an output directory (which need not exist yet)."""
    out, root = out_dir.resolve(), repo_root.resolve()
    return Layout(
        root_from_out=Path(os.path.relpath(root, out)).as_posix(),
        out_from_root=Path(os.path.relpath(out, root)).as_posix(),
    )
