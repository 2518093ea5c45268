"""The matrix's checks against the clock: a Capacity Block's end must not be past.

The clock is `utc_now` unless the caller passes `now` (generators/matrix/load.py's load and parse
take it; the tests pin it, the CLI tests replace generators.matrix.load.utc_now), so a check gives
the same answer on any day its test runs.
"""

from __future__ import annotations

import datetime as dt

from generators.core.yamlio import LineDict
from generators.matrix.fields import field_error


def utc_now() -> dt.datetime:
    """The clock the time checks read when no `now` is given."""
    return dt.datetime.now(dt.UTC)


def check_block_end(file: str, data: LineDict, prefix: str, text: str, blocks: bool, now: dt.datetime) -> None:
    """capacity_block_end: an ISO 8601 time with a zone, on a cluster of Capacity Blocks, not yet past."""
    from trainer.capacity_block import BadEndTime, parse_end

    line, key = data.key_lines["capacity_block_end"], f"{prefix}.capacity_block_end"
    try:
        end = parse_end(text)
    except BadEndTime as err:
        raise field_error(
            file, line, key, str(err), 'write the block\'s end in UTC, e.g. "2026-12-10T11:30:00Z"'
        ) from None
    if not blocks:
        raise field_error(
            file, line, key, "is set but capacity_blocks is not true", "set capacity_blocks: true or remove it"
        )
    if end is not None and end <= now.timestamp():
        raise field_error(
            file,
            line,
            key,
            f"{text} is past (now {now.strftime('%Y-%m-%dT%H:%M:%SZ')}): the block has ended, its instances are gone",
            "set the end of the cluster's next Capacity Block (aws ec2 describe-capacity-reservations), "
            "or remove capacity_block_end and capacity_blocks",
        )
