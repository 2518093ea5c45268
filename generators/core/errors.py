"""The generators' errors: one base, two kinds, turned into exit codes by the command layer only.

`InputError` (exit 2): the user's input is wrong (a matrix, a results file, an option). It knows the
file, the line (when it can be known), the offending key and the fix; `str()` of it is the one line
the command prints on stderr, with no traceback. `ToolError` (exit 1): a prerequisite or an external
tool failed in a way that says nothing about the input (a pinned Go tool is missing, kubeconform
printed no JSON, a write failed). Nothing below the four commands (generators/expand.py, cluster.py,
validate.py, report.py) prints or exits.
"""

from __future__ import annotations


class GeneratorError(Exception):
    """Base of every error the generators raise on purpose."""


class InputError(GeneratorError):
    """Bad input: a matrix, a results file or a command-line option (exit 2)."""

    def __init__(self, message: str, *, file: str = "", line: int = 0, key: str = "", fix: str = ""):
        # file: the path as the user gave it; line: 1-based, 0 when unknown;
        # key: dotted key in the input, e.g. "include[2].trainer.training.lr";
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


class ToolError(GeneratorError):
    """A tool or the file system failed for a reason outside the input (exit 1)."""
