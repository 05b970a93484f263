"""Reading datasets: JSON Lines (optionally gzip), CSV/TSV, Parquet, `datasets` folders,
modelshrink dataset artifacts, and hub dataset names (where the local cache has them).

Rows are streamed: files are read line by line or batch by batch, never loaded whole.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from modelshrink.artifacts import read_manifest
from modelshrink.errors import UserError
# Which column is the text, the summary, the id: one rule, shared with the torch-free runtime.
from modelshrink.runtime.columns import ID_COLUMNS, pick_columns
from modelshrink.runtime.jsonl import read_jsonl

__all__ = ["DataSource", "Example", "examples", "open_data", "pick_columns", "unique_keys"]

_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson")
_CSV_SUFFIXES = (".csv", ".tsv", ".csv.gz", ".tsv.gz")


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


@dataclass
class DataSource:
    """A dataset to stream. `rows()` yields plain dicts, in file order."""

    spec: str
    format: str
    path: Path | None = None
    split: str | None = None
    _hf: Any = None  # a `datasets.Dataset` for save_to_disk folders and hub names

    @property
    def columns(self) -> list[str]:
        if self._hf is not None:
            return list(self._hf.column_names)
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return list(pq.ParquetFile(self.path).schema_arrow.names)
        for row in self.rows():
            return list(row.keys())
        return []

    def rows(self) -> Iterator[dict[str, Any]]:
        if self._hf is not None:
            yield from self._hf
        elif self.format == "jsonl":
            yield from self._jsonl_rows()
        elif self.format == "csv":
            yield from self._csv_rows()
        elif self.format == "parquet":
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(self.path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()

    def _jsonl_rows(self) -> Iterator[dict[str, Any]]:
        yield from read_jsonl(self.path)

    def _csv_rows(self) -> Iterator[dict[str, Any]]:
        delimiter = "\t" if ".tsv" in self.path.name else ","
        try:
            with _open_text(self.path) as f:
                reader = csv.DictReader(f, delimiter=delimiter)
                for row in reader:
                    if None in row:
                        raise UserError(f"{self.path}: line {reader.line_num} has more fields than the header")
                    yield row
        except UnicodeDecodeError as e:
            raise UserError(f"{self.path} is not UTF-8 text ({e.reason})") from None
        except csv.Error as e:
            raise UserError(f"{self.path}: not valid CSV ({e})") from None
        except OSError as e:
            raise UserError(f"cannot read {self.path}: {e}") from None


def _looks_like_hub_name(spec: str) -> bool:
    return not spec.startswith((".", "/", "~")) and spec.count("/") <= 1 and not spec.endswith(
        _JSONL_SUFFIXES + _CSV_SUFFIXES + (".parquet",))


def _pick_split(dataset_dict: Any, split: str | None, spec: str) -> Any:
    splits = list(dataset_dict.keys())
    if split is None:
        if len(splits) == 1:
            return dataset_dict[splits[0]]
        raise UserError(f"{spec} has splits {', '.join(splits)}; choose one with --split")
    if split not in dataset_dict:
        raise UserError(f"{spec} has no split '{split}'; it has {', '.join(splits)}")
    return dataset_dict[split]


def _split_files(folder: Path) -> dict[str, Path]:
    """{split: file} for a folder of data files named by their split (train.jsonl.gz, validation.jsonl, ...)."""
    found = {}
    for child in sorted(folder.iterdir()):
        name = child.name.lower()
        suffix = next((x for x in _JSONL_SUFFIXES + _CSV_SUFFIXES + (".parquet",) if name.endswith(x)), None)
        if child.is_file() and suffix and len(name) > len(suffix):
            found.setdefault(child.name[:-len(suffix)], child)
    return found


def _unfinished(path: Path) -> bool:
    """Whether `path` is, or lies inside, an unfinished run's staging folder (`.NAME.partial`) or is
    one of its work files (`run.partial.json`, the parts)."""
    return any(part.endswith(".partial") or ".partial." in part for part in path.resolve().parts)


def open_data(spec: str | os.PathLike, split: str | None = None) -> DataSource:
    """Open a dataset given as a path or a hub name. Raises UserError when it cannot be read."""
    spec = str(spec)
    path = Path(spec).expanduser()
    if path.exists() and _unfinished(path):
        raise UserError(f"{spec} belongs to an unfinished run (a .partial staging folder or work file), not to a "
                        "finished artifact; finish that run with --resume and use its output")
    if path.is_dir():
        if read_manifest(path) is not None:
            if not (path / "data.jsonl").is_file():
                raise UserError(f"{path} is a modelshrink artifact but not a dataset (no data.jsonl)")
            return DataSource(spec, "jsonl", path / "data.jsonl")
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (
                path / "dataset_dict.json").is_file():
            import datasets

            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                loaded = _pick_split(loaded, split, spec)
            return DataSource(spec, "datasets", path, split, _hf=loaded)
        files = _split_files(path)
        if files:
            return open_data(_pick_split(files, split, spec), None)
        raise UserError(f"{path} is a folder but neither a modelshrink dataset artifact (data.jsonl + "
                        "modelshrink.json), a `datasets` save_to_disk folder, nor a folder of split files "
                        "(train.jsonl, validation.jsonl.gz, test.csv, ...)")
    if path.is_file():
        name = path.name.lower()
        if not os.access(path, os.R_OK):
            raise UserError(f"cannot read {path}: permission denied")
        if name.endswith(_JSONL_SUFFIXES):
            return DataSource(spec, "jsonl", path)
        if name.endswith(_CSV_SUFFIXES):
            return DataSource(spec, "csv", path)
        if name.endswith(".parquet"):
            return DataSource(spec, "parquet", path)
        raise UserError(f"{path}: unknown data format; expected .jsonl, .jsonl.gz, .csv, .tsv or .parquet, "
                        "a `datasets` folder, or a modelshrink dataset artifact")
    if _looks_like_hub_name(spec):
        return _open_hub_dataset(spec, split)
    raise UserError(f"data {spec} does not exist")


def _open_hub_dataset(name: str, split: str | None) -> DataSource:
    import datasets

    try:
        loaded = datasets.load_dataset(name, split=split)
    except Exception as e:  # datasets raises many types for "not cached / not found / offline"
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"data {name} is not a local path, and loading it as a hub dataset failed "
                        f"(offline and not in the cache?): {first_line}") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = _pick_split(loaded, split, name)
    return DataSource(name, "hub", None, split, _hf=loaded)


@dataclass
class Example:
    index: int
    id: str
    document: str
    reference: str | None


def examples(source: DataSource, text_column: str, summary_column: str | None = None,
             id_column: str | None = None, limit: int | None = None) -> Iterator[Example]:
    """Stream `Example`s in input order; rows without an id get their 0-based index as id."""
    for index, row in enumerate(source.rows()):
        if limit is not None and index >= limit:
            return
        document = row.get(text_column)
        if not isinstance(document, str):
            raise UserError(f"{source.spec}: row {index + 1} has no text in column '{text_column}' "
                            f"(found {type(document).__name__})")
        reference = row.get(summary_column) if summary_column else None
        if reference is not None and not isinstance(reference, str):
            reference = str(reference)
        ident = row.get(id_column) if id_column else next((row[c] for c in ID_COLUMNS if c in row), None)
        yield Example(index, str(index) if ident is None else str(ident), document, reference)


def unique_keys(ids: list[str]) -> list[str]:
    """Keys that pair rows across files even when ids repeat: the k-th occurrence of an id (k >= 2)
    becomes "id#k". Files keep their order, so the k-th "x" of one pairs with the k-th "x" of another."""
    seen: dict[str, int] = {}
    keys = []
    for ident in ids:
        seen[ident] = seen.get(ident, 0) + 1
        keys.append(ident if seen[ident] == 1 else f"{ident}#{seen[ident]}")
    return keys
