"""The price table (generators/plan/prices.yaml) and what a run costs.

A run's cost is nodes x hours x the On-Demand price of its instance type in its cluster's region;
GPU-hours are GPUs x hours. The table is read strictly, like the matrix: unknown or missing keys, an
instance type the catalog does not know, a region that is not a region name, a price that is not a
positive number (or null: no On-Demand offering), a date that is not YYYY-MM-DD, and two rows for
one instance type and region are bad input naming the table's file, line and key.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generators.core.errors import InputError
from generators.core.yamlio import LineDict, LineList, load_yaml
from trainer.catalog import INSTANCE_TYPES

PRICES_FILE = Path(__file__).resolve().parent / "prices.yaml"
ROW_KEYS = ("instance_type", "region", "usd_per_hour", "read", "source")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
TABLE_FIX = "each row of prices: {instance_type, region, usd_per_hour, read: YYYY-MM-DD, source}"


@dataclass(frozen=True, kw_only=True)
class Price:
    instance_type: str
    region: str
    usd_per_hour: float | None  # None: no On-Demand offering for this instance type and region
    read: str  # YYYY-MM-DD
    source: str
    line: int  # in the table file


@dataclass(frozen=True)
class PriceTable:
    file: str  # as the user named it (or the default's path relative to the repository)
    rows: dict[tuple[str, str], Price]

    def lookup(self, instance_type: str, region: str) -> Price | None:
        return self.rows.get((instance_type, region))


def _row(file: str, data: Any, line: int, key: str) -> Price:
    if not isinstance(data, LineDict):
        raise InputError("must be a mapping", file=file, line=line, key=key, fix=TABLE_FIX)
    for name in data:
        if name not in ROW_KEYS:
            raise InputError(
                f"unknown key {name!r}",
                file=file,
                line=data.key_lines[name],
                key=f"{key}.{name}",
                fix=f"use only {', '.join(ROW_KEYS)}",
            )
    for name in ROW_KEYS:
        if name not in data:
            raise InputError("missing", file=file, line=data.line, key=f"{key}.{name}", fix=TABLE_FIX)

    def at(name: str) -> tuple[int, str]:
        return data.key_lines[name], f"{key}.{name}"

    instance = data["instance_type"]
    if instance not in INSTANCE_TYPES:
        line_, key_ = at("instance_type")
        raise InputError(
            f"unknown instance type {instance!r}",
            file=file,
            line=line_,
            key=key_,
            fix=f"use one of the catalog's: {', '.join(sorted(INSTANCE_TYPES))} (trainer/catalog.py)",
        )
    region = data["region"]
    if not isinstance(region, str) or not _REGION.match(region):
        line_, key_ = at("region")
        raise InputError(
            f"{region!r} is not an AWS region name",
            file=file,
            line=line_,
            key=key_,
            fix="write the region code, e.g. us-west-2",
        )
    price = data["usd_per_hour"]
    if price is not None and (type(price) not in (int, float) or not price > 0 or price == float("inf")):
        line_, key_ = at("usd_per_hour")
        raise InputError(
            f"must be a positive number of US dollars per instance-hour, got {price!r}",
            file=file,
            line=line_,
            key=key_,
            fix="write the On-Demand hourly price, or null where there is none",
        )
    read = data["read"]
    try:
        datetime.date.fromisoformat(read if isinstance(read, str) else "")
    except ValueError:
        line_, key_ = at("read")
        raise InputError(
            f"must be a quoted date YYYY-MM-DD, got {read!r}",
            file=file,
            line=line_,
            key=key_,
            fix='write the date the price was read, e.g. read: "2026-11-30"',
        ) from None
    source = data["source"]
    if not isinstance(source, str) or not source.strip():
        line_, key_ = at("source")
        raise InputError(
            "must say where the price was read",
            file=file,
            line=line_,
            key=key_,
            fix="name the page or data file the price comes from",
        )
    return Price(
        instance_type=instance,
        region=region,
        usd_per_hour=None if price is None else float(price),
        read=read,
        source=source,
        line=line,
    )


def _shown(path: Path) -> str:
    """The default table relative to the repository (the same text on every machine)."""
    try:
        return path.resolve().relative_to(PRICES_FILE.parents[2]).as_posix()
    except ValueError:
        return str(path)


def load_prices(path: str | Path | None = None, label: str | None = None) -> PriceTable:
    """Read and check the price table (default: the one beside this module)."""
    path = Path(path) if path is not None else PRICES_FILE
    file = label or _shown(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("no such file", file=file, key="--prices", fix="pass an existing price table") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot be read ({err})", file=file, key="--prices", fix="pass a UTF-8 YAML file") from None
    data = load_yaml(text, file)
    if not isinstance(data, LineDict) or set(data) != {"prices"} or not isinstance(data["prices"], LineList):
        raise InputError(
            "must be a mapping with one key, prices: a list of rows",
            file=file,
            line=getattr(data, "line", 0),
            key="prices",
            fix=TABLE_FIX,
        )
    rows: dict[tuple[str, str], Price] = {}
    for i, (item, line) in enumerate(zip(data["prices"], data["prices"].item_lines, strict=True)):
        price = _row(file, item, line, f"prices[{i}]")
        first = rows.get((price.instance_type, price.region))
        if first is not None:
            raise InputError(
                f"{price.instance_type} in {price.region} is priced twice (first at line {first.line})",
                file=file,
                line=line,
                key=f"prices[{i}]",
                fix="keep one row per instance type and region",
            )
        rows[(price.instance_type, price.region)] = price
    return PriceTable(file=file, rows=rows)
