"""The experiment matrix: its schema (schema.py), the strict loader (load.py) and the expansion
into runs (expand.py). `load(path) -> Matrix`, then `expand(Matrix) -> list[Run]`."""

from generators.matrix.expand import expand
from generators.matrix.load import Matrix, load
from generators.matrix.schema import Cluster, GitSource, Run

__all__ = ["Cluster", "GitSource", "Matrix", "Run", "expand", "load"]
