"""The one strict YAML reader of the generators: every YAML they read goes through this module.

Two entry points, both strict (a key given twice in one mapping is an error, as it is for kustomize,
the API server and the trainer's config loader):
- `load_yaml(text, file)`: one document of user input (the experiment matrix) with the 1-based line of
  every mapping key and list item kept (`LineDict.key_lines`, `LineList.item_lines`), so every later
  error names its line without parsing again. Anchors, aliases, merge keys and non-string keys are
  refused (they hide what a value is). Any problem is an InputError naming file, line and key.
- `load_documents(text, file)`: every document of a manifest file or a `kustomize build` output, each
  with the line it starts on (`Doc`), through libyaml when PyYAML has it (several times faster on
  build outputs). Raises yaml.YAMLError; `error_position` turns one into (line, one-line text).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

import yaml

from generators.core.errors import InputError
from trainer.config import NoDuplicateKeys

# Deeper than any matrix needs; far below Python's recursion limit.
MAX_DEPTH = 32

# --------------------------------------------------------------------------------------------
# User input: one document, every line kept


class LineDict(dict):
    """A mapping from the matrix, with the 1-based line of itself and of each key."""

    line: int = 0
    key_lines: dict[str, int]


class LineList(list):
    """A sequence from the matrix, with the 1-based line of itself and of each item."""

    line: int = 0
    item_lines: list[int]


def join_key(parts: list[str]) -> str:
    """["include", "[0]", "nodes"] -> "include[0].nodes"."""
    out = ""
    for part in parts:
        if part:
            out += part if part.startswith("[") or not out else "." + part
    return out


class LineLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, anchors, aliases, merge keys and non-string keys."""

    def __init__(self, stream: str, file: str):
        super().__init__(stream)
        self.file = file
        self._path: list[str] = []

    def _where(self) -> str:
        return join_key(self._path) or "(top level)"

    def compose_node(self, parent: Any, index: Any) -> Any:
        if isinstance(index, yaml.ScalarNode):
            part = str(index.value)
        elif isinstance(index, int):
            part = f"[{index}]"
        else:
            part = ""
        self._path.append(part)
        try:
            event = self.peek_event()
            if len(self._path) > MAX_DEPTH:
                raise InputError(
                    f"nested deeper than {MAX_DEPTH} levels",
                    file=self.file,
                    line=event.start_mark.line + 1,
                    key=join_key(self._path[:MAX_DEPTH]) + "...",
                    fix="flatten the structure (a matrix needs a few levels)",
                )
            if isinstance(event, yaml.AliasEvent):
                raise InputError(
                    f"alias *{event.anchor} is not allowed",
                    file=self.file,
                    line=event.start_mark.line + 1 if event.start_mark else 0,
                    key=self._where(),
                    fix="write the value out in full (anchors and aliases hide what a run gets)",
                )
            anchor = getattr(event, "anchor", None)
            if anchor is not None:
                raise InputError(
                    f"anchor &{anchor} is not allowed",
                    file=self.file,
                    line=event.start_mark.line + 1,
                    key=self._where(),
                    fix="remove the anchor and write every value out in full",
                )
            return super().compose_node(parent, index)
        finally:
            self._path.pop()

    def construct_line_mapping(self, node: yaml.MappingNode) -> LineDict:
        out = LineDict()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InputError(
                    "merge key << is not allowed",
                    file=self.file,
                    line=line,
                    key=self._where(),
                    fix="write the keys out in this mapping",
                )
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise InputError(
                    f"key {key!r} is a {type(key).__name__}, not a string",
                    file=self.file,
                    line=line,
                    key=self._where(),
                    fix=f'quote the key: "{key_node.value}"',
                )
            if key in out:
                raise InputError(
                    f"duplicate key (first at line {out.key_lines[key]})",
                    file=self.file,
                    line=line,
                    key=join_key([*self._path, key]),
                    fix="keep one of the two entries",
                )
            self._path.append(key)
            try:
                out[key] = self.construct_object(value_node, deep=True)
            finally:
                self._path.pop()
            out.key_lines[key] = line
        return out

    def construct_line_sequence(self, node: yaml.SequenceNode) -> LineList:
        out = LineList()
        out.line = node.start_mark.line + 1
        out.item_lines = []
        for i, child in enumerate(node.value):
            self._path.append(f"[{i}]")
            try:
                out.append(self.construct_object(child, deep=True))
            finally:
                self._path.pop()
            out.item_lines.append(child.start_mark.line + 1)
        return out

    def construct_clean_str(self, node: yaml.ScalarNode) -> str:
        value = self.construct_yaml_str(node)
        bad = next((c for c in value if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0), None)
        if bad is not None:
            raise InputError(
                f"the value holds the control character {bad!r}",
                file=self.file,
                line=node.start_mark.line + 1,
                key=join_key(self._path) or "(top level)",
                fix="remove it (write plain text)",
            )
        return value


LineLoader.add_constructor("tag:yaml.org,2002:str", LineLoader.construct_clean_str)
LineLoader.add_constructor("tag:yaml.org,2002:map", LineLoader.construct_line_mapping)
LineLoader.add_constructor("tag:yaml.org,2002:seq", LineLoader.construct_line_sequence)


def load_yaml(text: str, file: str) -> Any:
    """Parse one strict YAML document; every problem is an InputError with its line."""
    loader = None
    try:
        loader = LineLoader(text, file)  # the reader refuses characters YAML does not allow right here
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = err.problem or err.context or "not valid YAML"
        raise InputError(
            f"YAML syntax error: {problem}",
            file=file,
            line=mark.line + 1 if mark else 0,
            fix="correct the YAML at this line (indentation, quoting, a missing ':')",
        ) from None
    except yaml.YAMLError as err:
        position = getattr(err, "position", None)  # a ReaderError: a character YAML does not allow
        line = text.count("\n", 0, position) + 1 if isinstance(position, int) else 0
        raise InputError(f"YAML error: {err}", file=file, line=line, fix="correct the YAML syntax") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as err:
        # A value PyYAML cannot build (an impossible date, ...): still one line, never a traceback.
        mark = getattr(loader, "problem_mark", None) if loader is not None else None
        raise InputError(
            f"cannot be read as YAML ({type(err).__name__}: {err})",
            file=file,
            line=mark.line + 1 if mark else 0,
            fix="correct or quote the value",
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_input(path: str, *, fix: str, max_bytes: int, key: str = "", label: str = "") -> str:
    """The UTF-8 text of an input file, refused (InputError naming the file) when it is missing, not a
    regular file (a directory, a FIFO, /dev/zero), larger than `max_bytes`, or not UTF-8. `label`: the
    name messages use (default: path); `key`: what names the file, e.g. "MATRIX"."""
    where: dict[str, Any] = {"file": label or path, "key": key, "fix": fix}
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError("file not found", **where) from None
    except OSError as err:
        raise InputError(f"cannot be read ({err.strerror})", **where) from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError("is a directory", **where)
    if not stat.S_ISREG(info.st_mode):
        raise InputError("is not a regular file (a device, a pipe or a socket)", **where)
    if info.st_size > max_bytes:
        raise InputError(f"is {info.st_size:,} bytes, more than the {max_bytes:,} this input may have", **where)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)  # the file may have grown since stat
    except OSError as err:
        raise InputError(f"cannot be read ({err.strerror})", **where) from None
    if len(data) > max_bytes:
        raise InputError(f"is more than the {max_bytes:,} bytes this input may have", **where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"is not UTF-8 text ({err.reason})", line=line, **where) from None


def error_position(err: yaml.YAMLError) -> tuple[int, str]:
    """(1-based line or 0, what is wrong in one line) of a PyYAML error."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    line = mark.line + 1 if mark is not None else 0
    what = " ".join(str(x) for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x) or str(err)
    return line, " ".join(what.split())


# --------------------------------------------------------------------------------------------
# Manifests: every document, each with its first line


@dataclass(frozen=True)
class Doc:
    """A YAML document and where it comes from (a file, or the kustomization that built it)."""

    data: Any
    file: str
    line: int = 0


# libyaml's loader when PyYAML has it (several times faster on build outputs), else the pure-Python one.
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DocumentLoader(NoDuplicateKeys, SafeLoader):  # type: ignore[misc, valid-type]
    """Safe loader that rejects duplicate keys (kustomize and the API server reject them too)."""


def load_documents(text: str, file: str, loader: type = DocumentLoader) -> list[Doc]:
    """The non-empty documents of a YAML text, each with its first line. Raises yaml.YAMLError."""
    ld = loader(text)
    try:
        docs = []
        while ld.check_node():
            node = ld.get_node()
            data = ld.construct_document(node)
            if data is not None:
                docs.append(Doc(data, file, node.start_mark.line + 1))
        return docs
    finally:
        ld.dispose()
