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


def field_error(file: str, line: int, key: str, message: str, fix: str) -> InputError:
    """The one-line input error for `key` at `file`:`line`: what is wrong (`message`) and how to fix it."""
    return InputError(message, file=file, line=line, key=key, fix=fix)


def type_word(tp: Any) -> str:
    """How an error message names the type `tp` (str, int, list, dict or bool): 'a string', ..."""
    return {str: "a string", int: "an integer", list: "a list", dict: "a mapping", bool: "true or false"}[tp]


def is_type(value: Any, tp: Any) -> bool:
    """Whether `value` is of the field type `tp`: a bool is no integer, and any Mapping is a mapping."""
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is dict:
        return isinstance(value, Mapping)
    return isinstance(value, tp)


def suggest_key(key: str, known: typing.Iterable[str], *, before: str = "", after: str = "", level: str = "") -> str:
    """'did you mean ...? known keys ...': the closest of `known` to `key`, shown between `before` and
    `after` (a dotted key shows whole: 'checkpoint.interval_steps'); `level` names the mapping the
    known keys belong to (default: here)."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {before + close[0] + after!r}? " if close else ""
    return f"{hint}known keys {f'of {level}' if level else 'here'}: {', '.join(known)}"


def check_keys(file: str, data: LineDict, known: typing.Iterable[str], prefix: str) -> None:
    """Refuse a key of `data` that is not in `known`, naming the closest known key; `prefix` is the
    dotted key of `data` itself ('' at the top)."""
    known = tuple(known)
    for key in data:
        if key not in known:
            raise field_error(
                file,
                data.key_lines[key],
                f"{prefix}.{key}" if prefix else key,
                "unknown key",
                f"remove it or use a known key ({suggest_key(key, known)})",
            )


def require_mapping(file: str, value: Any, line: int, key: str, what: str) -> LineDict:
    """`value` when it is a mapping; else an error at `key` that says a mapping (`what`) belongs there."""
    if not isinstance(value, LineDict):
        raise field_error(
            file,
            line,
            key,
            f"must be a mapping ({what}), got {describe_value(value)}",
            f"write {key} as 'key: value' lines indented under it",
        )
    return value


def describe_value(value: Any) -> str:
    """How an error message shows a value it refuses: 'nothing', 'a mapping', 'a list' or its repr and type."""
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r} ({type(value).__name__})"


def check_fields(file: str, data: LineDict, schema: Mapping[str, tuple[Any, Any]], prefix: str) -> dict[str, Any]:
    """Check keys and value types of a flat mapping against `schema`; fill in the defaults."""
    check_keys(file, data, schema, prefix)
    out: dict[str, Any] = {}
    for name, (tp, default) in schema.items():
        key = f"{prefix}.{name}"
        if name not in data:
            if default is None:
                raise field_error(file, data.line, key, "is required", f"add {name} under {prefix}")
            out[name] = default
            continue
        value = data[name]
        if not is_type(value, tp):
            fix = f"set {name} to {type_word(tp)}"
            if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                fix = f'quote it: {name}: "{value}"'
            raise field_error(
                file, data.key_lines[name], key, f"got {describe_value(value)}; must be {type_word(tp)}", fix
            )
        out[name] = value
    return out


def check_str_list(
    file: str, data: LineDict, name: str, prefix: str, pattern: re.Pattern[str] | None, what: str, nonempty: bool
) -> tuple[str, ...]:
    """The list of strings at `data[name]` (empty when absent), each matching `pattern` where given and
    none listed twice; `what` names one item in the errors, `nonempty` refuses an empty list."""
    items = data.get(name, [])
    line = data.key_lines.get(name, data.line)
    if nonempty and not items:
        raise field_error(file, line, f"{prefix}.{name}", "must not be empty", f"list at least one {what}")
    seen: set[str] = set()
    for i, item in enumerate(items):
        iline = items.item_lines[i] if isinstance(items, LineList) else line
        ikey = f"{prefix}.{name}[{i}]"
        if not isinstance(item, str):
            raise field_error(file, iline, ikey, f"got {describe_value(item)}; must be a string", f"write a {what}")
        if pattern is not None and not pattern.match(item):
            raise field_error(file, iline, ikey, f"{item!r} is not a valid {what}", f"write a {what}")
        if item in seen:
            raise field_error(file, iline, ikey, f"{item!r} is listed twice", "list it once")
        seen.add(item)
    return tuple(items)
