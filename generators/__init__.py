"""Generators: Click CLIs over an importable core that turn matrix.yaml into committed overlays."""
