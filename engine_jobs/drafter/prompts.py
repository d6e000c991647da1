"""Prompts for self-distillation from a dataset file or folder (a downloaded dataset repo, a PVC folder).

Only the prompts are read: the base writes the responses itself. JSONL, JSON, CSV and (with pyarrow)
Parquet; a folder is read file by file in sorted order, so the first ``limit`` prompts are the same ones on
every run. No torch here: the training Job's shell reads prompts before the worker starts.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import bad_input

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
#: metadata files of a dataset repository or a saved ``datasets`` folder, not records
METADATA_FILES = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"})


def _data_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise bad_input(f"dataset path {path} does not exist")
    files = []
    for file in sorted(path.rglob("*")):
        parts = file.relative_to(path).parts
        if any(part.startswith(".") for part in parts):  # .cache, .git, .huggingface
            continue
        if file.is_file() and file.suffix.lower() in SUFFIXES and file.name not in METADATA_FILES:
            files.append(file)
    if not files:
        raise bad_input(f"dataset {path} holds no data files (looked for {', '.join(SUFFIXES)})")
    return files


def _jsonl(file: Path) -> Iterator[Any]:
    with open(file, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise bad_input(f"dataset {file.name} line {number} is not JSON: {exc.msg}") from None


def _json(file: Path) -> Iterator[Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise bad_input(f"dataset {file.name} is not JSON: {exc.msg} (line {exc.lineno})") from None
    if isinstance(data, dict):
        for key in ("data", "rows"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            raise bad_input(
                f"dataset {file.name} must hold a list of records, or an object with a 'data' or 'rows' list"
            )
    if not isinstance(data, list):
        raise bad_input(f"dataset {file.name} must hold a list of records, got {type(data).__name__}")
    yield from data


def _csv(file: Path) -> Iterator[Any]:
    with open(file, encoding="utf-8", newline="") as fh:
        yield from csv.DictReader(fh)


def _parquet(file: Path) -> Iterator[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise bad_input(
            f"dataset {file.name} is Parquet, which needs pyarrow (not installed here); JSONL works without it"
        ) from None
    for batch in pq.ParquetFile(file).iter_batches():
        yield from batch.to_pylist()


READERS = {".jsonl": _jsonl, ".json": _json, ".csv": _csv, ".parquet": _parquet}


def load_prompts(path: Path, column: str, limit: int) -> list[str]:
    """The first ``limit`` non-empty strings of ``column`` across the dataset's files."""
    prompts: list[str] = []
    for file in _data_files(Path(path)):
        reader = READERS.get(file.suffix.lower())
        if reader is None:
            raise bad_input(f"dataset {file.name}: unknown format (use {', '.join(SUFFIXES)})")
        try:
            for index, record in enumerate(reader(file)):
                if not isinstance(record, dict):
                    raise bad_input(f"dataset {file.name} record {index} is not an object (a {type(record).__name__})")
                if column not in record:
                    keys = ", ".join(sorted(map(str, record))[:20]) or "none"
                    raise bad_input(f"dataset {file.name} record {index} has no column {column!r} (keys: {keys})")
                value = record[column]
                if not isinstance(value, str):
                    raise bad_input(
                        f"dataset {file.name} record {index}: column {column!r} is a "
                        f"{type(value).__name__}, not a string"
                    )
                if value:
                    prompts.append(value)
                    if len(prompts) >= limit:
                        return prompts
        except (OSError, UnicodeDecodeError) as exc:
            raise bad_input(f"dataset {file.name} is unreadable: {exc}") from None
    if not prompts:
        raise bad_input(f"dataset {path} has no prompts in column {column!r}")
    return prompts
