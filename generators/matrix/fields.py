"""The value checks every section of an experiment matrix shares (generators/matrix/load.py uses them):
one-line errors with file, line, key and fix; known keys with the closest suggestion; typed fields."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from typing import Any

from generators.core.errors import InputError
from generators.core.yamlio import LineDict, LineList


def _err(file: str, line: int, key: str, message: str, fix: str) -> InputError:
    return InputError(message, file=file, line=line, key=key, fix=fix)


def _type_word(tp: Any) -> str:
    return {str: "a string", int: "an integer", list: "a list", dict: "a mapping", bool: "true or false"}[tp]


def _is_type(value: Any, tp: Any) -> bool:
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is dict:
        return isinstance(value, Mapping)
    return isinstance(value, tp)


def _suggest(key: str, known: typing.Iterable[str], *, before: str = "", after: str = "", level: str = "") -> str:
    """'did you mean ...? known keys ...': the closest of `known` to `key`, shown between `before` and
    `after` (a dotted key shows whole: 'checkpoint.interval_steps'); `level` names the mapping the
    known keys belong to (default: here)."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {before + close[0] + after!r}? " if close else ""
    return f"{hint}known keys {f'of {level}' if level else 'here'}: {', '.join(known)}"


def _check_keys(file: str, data: LineDict, known: typing.Iterable[str], prefix: str) -> None:
    known = tuple(known)
    for key in data:
        if key not in known:
            raise _err(
                file,
                data.key_lines[key],
                f"{prefix}.{key}" if prefix else key,
                "unknown key",
                f"remove it or use a known key ({_suggest(key, known)})",
            )


def _mapping(file: str, value: Any, line: int, key: str, what: str) -> LineDict:
    if not isinstance(value, LineDict):
        raise _err(
            file,
            line,
            key,
            f"must be a mapping ({what}), got {_describe(value)}",
            f"write {key} as 'key: value' lines indented under it",
        )
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r} ({type(value).__name__})"


def _fields(file: str, data: LineDict, schema: Mapping[str, tuple[Any, Any]], prefix: str) -> dict[str, Any]:
    """Check keys and value types of a flat mapping against `schema`; fill in the defaults."""
    _check_keys(file, data, schema, prefix)
    out: dict[str, Any] = {}
    for name, (tp, default) in schema.items():
        key = f"{prefix}.{name}"
        if name not in data:
            if default is None:
                raise _err(file, data.line, key, "is required", f"add {name} under {prefix}")
            out[name] = default
            continue
        value = data[name]
        if not _is_type(value, tp):
            fix = f"set {name} to {_type_word(tp)}"
            if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                fix = f'quote it: {name}: "{value}"'
            raise _err(file, data.key_lines[name], key, f"got {_describe(value)}; must be {_type_word(tp)}", fix)
        out[name] = value
    return out


def _str_list(
    file: str, data: LineDict, name: str, prefix: str, pattern: re.Pattern[str] | None, what: str, nonempty: bool
) -> tuple[str, ...]:
    items = data.get(name, [])
    line = data.key_lines.get(name, data.line)
    if nonempty and not items:
        raise _err(file, line, f"{prefix}.{name}", "must not be empty", f"list at least one {what}")
    seen: set[str] = set()
    for i, item in enumerate(items):
        iline = items.item_lines[i] if isinstance(items, LineList) else line
        ikey = f"{prefix}.{name}[{i}]"
        if not isinstance(item, str):
            raise _err(file, iline, ikey, f"got {_describe(item)}; must be a string", f"write a {what}")
        if pattern is not None and not pattern.match(item):
            raise _err(file, iline, ikey, f"{item!r} is not a valid {what}", f"write a {what}")
        if item in seen:
            raise _err(file, iline, ikey, f"{item!r} is listed twice", "list it once")
        seen.add(item)
    return tuple(items)
