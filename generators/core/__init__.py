"""What every job of the generators shares: errors (errors.py), the one strict YAML reader
(yamlio.py), the one writer of generated files (writer.py), the pinned Go tools (gotools.py) and the
commands' glue to Click (cli.py)."""
