"""Reading datasets: JSON Lines (optionally gzip), CSV/TSV, Parquet, `datasets` folders,
modelshrink dataset artifacts, and hub dataset names (where the local cache has them).

Rows are streamed: files are read line by line or batch by batch, never loaded whole.

Bad input is one UserError naming the file and the line (the row, for Parquet and `datasets`), never a
traceback; the rules shared with the torch-free runtime live in `runtime.jsonl` (lines) and
`runtime.columns` (what counts as text):
- a UTF-8 byte order mark is dropped and CRLF reads as LF, in JSON Lines and CSV/TSV, plain or gzip;
- blank lines are skipped; a line that is not a JSON object, a CSV row with more or fewer fields than its
  header, bytes that are not UTF-8 and damaged or truncated gzip data are refused with their line number;
- a file with no rows is refused ("FILE has no rows");
- `examples()` refuses a row whose text is missing, null, empty, or not a string (a number, array, object),
  and, when a summary column is read, a row whose summary is missing, null or not a string (an empty summary
  is kept). Rows are never skipped quietly, so ids and counts stay those of the file.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from modelshrink.artifacts import in_staging, read_manifest, unfinished_input
from modelshrink.errors import UserError
# Which column is the text, the summary, the id: one rule, shared with the torch-free runtime.
from modelshrink.runtime.columns import ID_COLUMNS, pick_columns, text_problem
from modelshrink.runtime.jsonl import numbered_jsonl, text_lines

__all__ = ["DataSource", "Example", "examples", "language_pairs", "open_data", "pick_columns", "unique_keys"]

_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson")
_CSV_SUFFIXES = (".csv", ".tsv", ".csv.gz", ".tsv.gz")


# The csv module refuses a field over 128 KiB unless told otherwise, and a long document is one field. The
# limit is process-wide, so it is only ever raised (2**31 - 1: the largest every platform's C long holds).
_CSV_FIELD_LIMIT = 2**31 - 1


@dataclass
class DataSource:
    """A dataset to stream. `rows()` yields plain dicts, in file order; `numbered_rows()` pairs each with its
    line number in the file (None for Parquet and `datasets`, whose rows have no lines)."""

    spec: str
    format: str
    path: Path | None = None
    split: str | None = None
    _hf: Any = None  # a `datasets.Dataset` for save_to_disk folders and hub names

    @property
    def name(self) -> str:
        """What messages call this data: the file read, else the path or name given."""
        return str(self.path) if self.path is not None and self._hf is None else self.spec

    @property
    def columns(self) -> list[str]:
        if self._hf is not None:
            return list(self._hf.column_names)
        if self.format == "parquet":
            return list(self._parquet_file().schema_arrow.names)
        return list(next(self.rows()))  # rows() raises UserError when there is none

    def rows(self) -> Iterator[dict[str, Any]]:
        for _, row in self.numbered_rows():
            yield row

    def numbered_rows(self) -> Iterator[tuple[int | None, dict[str, Any]]]:
        """(line number or None, row) for every row; a UserError when there is no row at all."""
        count = 0
        for count, numbered in enumerate(self._numbered_rows(), start=1):
            yield numbered
        if count == 0:
            raise UserError(f"{self.name} has no rows")

    def _numbered_rows(self) -> Iterator[tuple[int | None, dict[str, Any]]]:
        if self._hf is not None:
            for row in self._hf:
                yield None, row
        elif self.format == "jsonl":
            yield from numbered_jsonl(self.path)
        elif self.format == "csv":
            yield from self._csv_rows()
        elif self.format == "parquet":
            yield from self._parquet_rows()

    def _csv_rows(self) -> Iterator[tuple[int, dict[str, str]]]:
        csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
        delimiter = "\t" if ".tsv" in self.path.name.lower() else ","
        # strict: an unclosed or stray quote is an error at its line, not rows silently merged into one field.
        reader = csv.reader((line for _, line in text_lines(self.path)), delimiter=delimiter, strict=True)
        header = None
        while True:
            start = reader.line_num + 1  # the first line of the next record (a quoted field may span lines)
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise UserError(f"{self.path}: line {start} is not valid CSV ({e})") from None
            if not fields:  # a blank line
                continue
            if header is None:
                header = _csv_header(self.path, start, fields)
            elif len(fields) != len(header):
                raise UserError(f"{self.path}: line {start} has {_fields(len(fields))}; the header has "
                                f"{_fields(len(header))}")
            else:
                yield start, dict(zip(header, fields))

    def _parquet_file(self) -> Any:
        import pyarrow
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(self.path)
        except (pyarrow.ArrowException, OSError) as e:
            raise UserError(f"cannot read {self.path}: {_first_line(e)}") from None

    def _parquet_rows(self) -> Iterator[tuple[None, dict[str, Any]]]:
        import pyarrow

        done = 0
        try:
            for batch in self._parquet_file().iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    yield None, row
                done += batch.num_rows
        except (pyarrow.ArrowException, OSError) as e:
            raise UserError(f"cannot read {self.path}: damaged Parquet data after row {done} "
                            f"({_first_line(e)})") from None


def _fields(count: int) -> str:
    return f"{count} field" if count == 1 else f"{count} fields"


def _csv_header(path: Path, line: int, names: list[str]) -> list[str]:
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise UserError(f"{path}: line {line}, the header, names column '{twice}' twice")
    return names


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


TRANSLATION = "translation"  # the nested column of translation rows: {"translation": {"en": ..., "de": ...}}


@dataclass
class LanguagePairs(DataSource):
    """Rows of the form {"translation": {LANG: text, ...}, ...} read as `source` and `target` columns (the
    languages chosen), beside the rows' other columns."""

    inner: DataSource | None = None
    source_lang: str = ""
    target_lang: str = ""

    @property
    def columns(self) -> list[str]:
        return [c for c in self.inner.columns if c != TRANSLATION] + ["source", "target"]

    def _numbered_rows(self) -> Iterator[tuple[int | None, dict[str, Any]]]:
        for number, row in self.inner.numbered_rows():
            pair = row.get(TRANSLATION)
            where = f"{self.name}: {'line ' + str(number) if number else 'a row'}"
            if not isinstance(pair, dict):
                raise UserError(f"{where} has no '{TRANSLATION}' object of languages")
            for lang in (self.source_lang, self.target_lang):
                if lang not in pair:
                    raise UserError(f"{where} has no '{lang}' in its translation (languages there: "
                                    f"{', '.join(map(str, pair)) or 'none'})")
            rest = {k: v for k, v in row.items() if k != TRANSLATION}
            yield number, {**rest, "source": pair[self.source_lang], "target": pair[self.target_lang]}


def language_pairs(source: DataSource, source_lang: str | None, target_lang: str | None,
                   with_model: bool = False) -> DataSource:
    """`source` itself, or its nested translation rows read as source/target columns: with --source-lang and
    --target-lang, or refused in one line when the rows are nested and the languages are not given. With a model
    (`with_model`), --target-lang alone over flat rows picks the language a multilingual model writes."""
    nested = TRANSLATION in source.columns
    if source_lang is None and target_lang is None:
        if nested:
            first = next(source.rows()).get(TRANSLATION)
            langs = ", ".join(map(str, first)) if isinstance(first, dict) else "?"
            raise UserError(f"{source.name} holds translation rows ({langs}): choose the pair with --source-lang "
                            "and --target-lang")
        return source
    if not nested and source_lang is None and with_model:
        return source  # --target-lang alone: the language a multilingual model translates into (modelshrink.languages)
    if source_lang is None or target_lang is None:
        raise UserError("--source-lang and --target-lang go together")
    if not nested:
        raise UserError(f"--source-lang/--target-lang read rows of the form {{\"translation\": {{LANG: text}}}}, "
                        f"and {source.name} has none; columns found: {', '.join(source.columns)}")
    return LanguagePairs(source.spec, source.format, source.path, source.split, inner=source,
                         source_lang=source_lang, target_lang=target_lang)


def open_data(spec: str | os.PathLike, split: str | None = None) -> DataSource:
    """Open a dataset given as a path or a hub name. Raises UserError when it cannot be read."""
    spec = str(spec)
    path = Path(spec).expanduser()
    if path.exists() and in_staging(path):
        raise UserError(unfinished_input(spec))
    if path.is_dir():
        if read_manifest(path) is not None:
            if not (path / "data.jsonl").is_file():
                raise UserError(f"{path} is a modelshrink artifact but not a dataset (no data.jsonl)")
            return DataSource(spec, "jsonl", path / "data.jsonl")
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (
                path / "dataset_dict.json").is_file():
            import datasets

            loaded = _load_from_disk(path)
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


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _saved_without_rows(state: Path) -> bool:
    """Whether a `datasets` state.json lists no data files: how datasets saves a dataset of no rows, which
    load_from_disk then fails to read back (IndexError)."""
    try:
        return json.loads(state.read_text(encoding="utf-8")).get("_data_files") == []
    except (OSError, ValueError, AttributeError):
        return False  # unreadable or not a state: load_from_disk says why


def _load_from_disk(path: Path) -> Any:
    import datasets
    import pyarrow

    for state in [path / "state.json", *path.glob("*/state.json")]:  # the dataset, or each split of a dict
        if state.is_file() and _saved_without_rows(state):
            raise UserError(f"{state.parent} has no rows")
    try:
        return datasets.load_from_disk(str(path))
    except (OSError, ValueError, pyarrow.ArrowException) as e:  # missing or damaged files, bad JSON in them
        raise UserError(f"cannot read {path} as a `datasets` save_to_disk folder: {_first_line(e)}") from None


def _open_hub_dataset(name: str, split: str | None) -> DataSource:
    import datasets

    try:
        loaded = datasets.load_dataset(name, split=split)
    except Exception as e:  # datasets raises many types for "not cached / not found / offline"
        raise UserError(f"data {name} is not a local path, and loading it as a hub dataset failed "
                        f"(offline and not in the cache?): {_first_line(e)}") from None
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
    """Stream `Example`s in input order; rows without an id get their 0-based index as id. A row without
    text, or without a summary when `summary_column` is read, is a UserError naming its line and row."""
    for index, (line, row) in enumerate(source.numbered_rows()):
        if limit is not None and index >= limit:
            return
        problem = text_problem(row, text_column)
        if problem:
            raise UserError(f"{_where(source, line, index)} has no text: {problem}")
        if summary_column:
            problem = text_problem(row, summary_column, allow_empty=True)
            if problem:
                raise UserError(f"{_where(source, line, index)} has no summary: {problem}")
        ident = row.get(id_column) if id_column else next((row[c] for c in ID_COLUMNS if c in row), None)
        yield Example(index, str(index) if ident is None else str(ident), row[text_column],
                      row[summary_column] if summary_column else None)


def _where(source: DataSource, line: int | None, index: int) -> str:
    """Where a row is: "docs.jsonl: line 7, row 6" (blank lines and a CSV header make the two differ), or
    "x.parquet: row 6"."""
    return f"{source.name}: line {line}, row {index + 1}" if line is not None else f"{source.name}: row {index + 1}"


def unique_keys(ids: list[str]) -> list[str]:
    """Keys that pair rows across files even when ids repeat: the k-th occurrence of an id (k >= 2)
    becomes "id#k". Files keep their order, so the k-th "x" of one pairs with the k-th "x" of another."""
    seen: dict[str, int] = {}
    keys = []
    for ident in ids:
        seen[ident] = seen.get(ident, 0) + 1
        keys.append(ident if seen[ident] == 1 else f"{ident}#{seen[ident]}")
    return keys
