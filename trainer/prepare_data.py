"""Stage a dataset on the shared volume in the trainer's format, once.

    python -m trainer.prepare_data --dataset knkarthick/samsum --format samsum --out /shared/data/samsum
    python -m trainer.prepare_data --dataset ./my-dataset --format alpaca --out /shared/data/mine --split train

--dataset is a public dataset on the Hugging Face hub, loaded with the `datasets` package into the
Hugging Face cache (HF_HOME when it is set, else <parent of --out>/.cache/huggingface, so every node
of the cluster shares one download), or a local folder: one written by `Dataset.save_to_disk`, or a
folder of data files (JSON lines, CSV, Parquet) that `datasets.load_dataset` reads. Tests use local
folders only; nothing here is needed offline but `datasets`.

Writes <out>/<split>.jsonl (train.jsonl by default): one JSON object per line with the format's fields
(samsum: dialogue, summary; alpaca: instruction, input, output), which is what `data.path` of the
trainer reads. Rows with a missing or non-text field are skipped and counted. Tokenising stays in the
trainer: it takes seconds for datasets of this size and depends on the model's tokenizer.

All or nothing, and once: the file is written aside and renamed, then the marker <out>/_COMPLETE (the
dataset, format, split, row count and SHA-256 of the file) is written last, the same way. A run that
finds the marker for the same dataset, format and split does nothing and says so (exit 0); a marker
for anything else is refused. A run that died before its marker is simply redone. Concurrent runs
on one --out take turns (a lock file in --out). Bad input (an unknown dataset or split, a dataset
without the format's fields) is one line `error: ...` on stderr and exit status 2, with nothing
written; a failed download is one line and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from trainer.config import ConfigError
from trainer.data import FIELDS, format_example

MARKER = "_COMPLETE"
LOCK = ".prepare.lock"
FORMATS = ("samsum", "alpaca")


class PrepareError(Exception):
    """Bad input (exit status 2) or, with status 1, a failure of the environment such as the network."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def columns_of(fmt: str) -> tuple[str, ...]:
    return FIELDS[fmt] + (("input",) if fmt == "alpaca" else ())


def load_rows(source: str, split: str) -> Any:
    """The split of a hub dataset or local folder, as a `datasets.Dataset`."""
    import datasets

    datasets.disable_progress_bars()
    try:
        if os.path.isdir(source):
            saved = any(
                os.path.isfile(os.path.join(source, name))
                for name in ("dataset_dict.json", "state.json", "dataset_info.json")
            )
            data = datasets.load_from_disk(source) if saved else datasets.load_dataset(source, split=split)
            if isinstance(data, datasets.DatasetDict):
                if split not in data:
                    raise PrepareError(f"--split: {source} has no split {split!r}; it has {', '.join(data)}")
                data = data[split]
            return data
        if source.startswith((".", "/")) or os.sep in source.strip("/").split("/", 1)[-1]:
            raise PrepareError(
                f"--dataset: folder {source} not found; give a local dataset folder or a hub "
                "name such as knkarthick/samsum"
            )
        return datasets.load_dataset(source, split=split)
    except PrepareError:
        raise
    except (FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as err:
        raise PrepareError(f"--dataset: {source} not found ({_first_line(err)}); check the name or folder") from None
    except ValueError as err:
        # datasets reports an unknown split (and unreadable data files) as ValueError.
        raise PrepareError(f"--dataset {source} --split {split}: {_first_line(err)}") from None
    except (ConnectionError, TimeoutError, OSError) as err:
        raise PrepareError(f"--dataset: could not download {source}: {_first_line(err)}", status=1) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def convert(data: Any, fmt: str, source: str) -> tuple[list[str], int]:
    """(JSON lines in the trainer's format, rows skipped for a missing or non-text field)."""
    missing = [name for name in FIELDS[fmt] if name not in data.column_names]
    if missing:
        raise PrepareError(
            f"--format {fmt}: {source} has no column {', '.join(missing)} (it has "
            f"{', '.join(data.column_names)}); pick the format that matches, samsum or alpaca"
        )
    lines, skipped = [], 0
    for index, row in enumerate(data):
        record = {name: row.get(name) for name in columns_of(fmt) if name in row}
        if fmt == "alpaca" and record.get("input") is None:
            record["input"] = ""
        try:
            format_example(fmt, record, f"{source} row {index}")
        except ConfigError:
            skipped += 1
            continue
        lines.append(json.dumps(record, ensure_ascii=False))
    if not lines:
        raise PrepareError(f"--dataset: none of the {skipped} rows of {source} has text in {', '.join(FIELDS[fmt])}")
    return lines, skipped


def _write_atomically(path: str, text: str) -> None:
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.path.basename(path)}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_marker(out: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(out, MARKER), encoding="utf-8") as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _done_already(out: str, wanted: dict[str, str]) -> dict[str, Any] | None:
    """The marker when this exact preparation is complete; refuses a marker for another one."""
    marker = read_marker(out)
    if marker is None:
        return None
    if {key: marker.get(key) for key in wanted} != wanted:
        raise PrepareError(
            f"--out: {out} already holds {marker.get('dataset')} (format {marker.get('format')}, "
            f"split {marker.get('split')}); use another --out, or remove {out} to replace it"
        )
    return marker


@contextlib.contextmanager
def _locked(out: str) -> Iterator[None]:
    with open(os.path.join(out, LOCK), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare(source: str, fmt: str, out: str, split: str = "train") -> tuple[dict[str, Any], bool]:
    """(the marker, whether this call wrote the data) for `source` staged under `out`."""
    wanted = {"dataset": source, "format": fmt, "split": split}
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepareError(f"--out: {out} is a file; give a directory")
    marker = _done_already(out, wanted)
    if marker is not None:
        return marker, False
    lines, skipped = convert(load_rows(source, split), fmt, source)
    os.makedirs(out, exist_ok=True)
    with _locked(out):
        marker = _done_already(out, wanted)  # another run may have finished while this one loaded
        if marker is not None:
            return marker, False
        text = "\n".join(lines) + "\n"
        name = f"{split}.jsonl"
        _write_atomically(os.path.join(out, name), text)
        import datasets

        marker = {
            **wanted,
            "file": name,
            "rows": len(lines),
            "skipped_rows": skipped,
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "datasets_version": datasets.__version__,
            "time": time.time(),
        }
        _write_atomically(os.path.join(out, MARKER), json.dumps(marker, indent=2) + "\n")
        _fsync_dir(out)
    return marker, True


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; see python -m trainer.prepare_data --help", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m trainer.prepare_data",
        description="Stage a dataset on the shared volume in the trainer's format, once.",
    )
    parser.add_argument("--dataset", required=True, help="hub dataset name or local dataset folder")
    parser.add_argument("--format", required=True, choices=FORMATS, help="the trainer's data.format")
    parser.add_argument("--out", required=True, help="output folder, e.g. /shared/data/samsum")
    parser.add_argument("--split", default="train", help="dataset split to write (default: train)")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    # The download cache sits on the same volume as the data unless the environment names one.
    os.environ.setdefault("HF_HOME", os.path.join(os.path.dirname(out), ".cache", "huggingface"))
    try:
        marker, wrote = prepare(args.dataset, args.format, out, args.split)
    except PrepareError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.status
    path = os.path.join(out, marker["file"])
    if wrote:
        print(
            f"prepared {path}: {marker['rows']} rows ({marker['skipped_rows']} skipped for a missing field) "
            f"from {args.dataset}; marker {os.path.join(out, MARKER)}"
        )
    else:
        print(f"already prepared: {path} ({marker['rows']} rows, marker {os.path.join(out, MARKER)}); nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
