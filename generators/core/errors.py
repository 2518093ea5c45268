"""The generator's one domain error.

Every mistake in a matrix becomes a `MatrixError` that knows the file, the line (when it can be
known), the offending key and the fix; `str()` of it is the one line the CLI prints on stderr
(exit code 2) with no traceback. Nothing else in generators/ prints or exits.
"""
from __future__ import annotations


class MatrixError(Exception):
    """Bad input in an experiment matrix (or on the command line that names it)."""

    def __init__(self, message: str, *, file: str = "", line: int = 0, key: str = "", fix: str = ""):
        # file: the matrix path as the user gave it; line: 1-based, 0 when unknown;
        # key: dotted key in the matrix, e.g. "include[2].trainer.training.lr";
        # message: what is wrong; fix: what to change (imperative).
        self.file = file
        self.line = line
        self.key = key
        self.message = message
        self.fix = fix
        super().__init__(self.format())

    def format(self) -> str:
        """`matrix.yaml:12: defaults.nodes: must be at least 1; fix: set nodes to 1 or more` (one line)."""
        where = self.file + (f":{self.line}" if self.line else "") if self.file else ""
        parts = [p for p in (where, self.key) if p]
        head = ": ".join(parts + [self.message])
        text = f"{head}; fix: {self.fix}" if self.fix else head
        # Keep it one line whatever the parts contain (YAML problems can span lines).
        return " ".join(text.split())
