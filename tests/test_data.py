"""Reading datasets in every supported form, column detection, and bad input."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from conftest import SHARED_DATA, write_jsonl
from modelshrink.artifacts import ArtifactWriter
from modelshrink.data import examples, open_data, pick_columns
from modelshrink.errors import UserError

ROWS = [{"id": f"r{i}", "article": f"text number {i}", "highlights": f"sum {i}"} for i in range(5)]


def _read_all(spec, **kw):
    source = open_data(spec, kw.pop("split", None))
    text, summary = pick_columns(source.columns, **kw)
    return [(e.id, e.document, e.reference) for e in examples(source, text, summary)]


EXPECTED = [(f"r{i}", f"text number {i}", f"sum {i}") for i in range(5)]


def test_jsonl_and_gzip(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ROWS)
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    assert _read_all(tmp_path / "a.jsonl") == EXPECTED
    assert _read_all(tmp_path / "a.jsonl.gz") == EXPECTED


def test_csv(tmp_path):
    with open(tmp_path / "a.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "article", "highlights"])
        writer.writeheader()
        writer.writerows(ROWS)
    assert _read_all(tmp_path / "a.csv") == EXPECTED


def test_parquet_and_datasets_folder(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "a.parquet"))
    assert _read_all(tmp_path / "a.parquet") == EXPECTED
    ds.save_to_disk(str(tmp_path / "single"))
    assert _read_all(tmp_path / "single") == EXPECTED
    datasets.DatasetDict({"train": ds, "validation": ds.select([0])}).save_to_disk(str(tmp_path / "dict"))
    assert _read_all(tmp_path / "dict", split="validation") == EXPECTED[:1]
    with pytest.raises(UserError, match="choose one with --split"):
        open_data(tmp_path / "dict")
    with pytest.raises(UserError, match="no split 'test'"):
        open_data(tmp_path / "dict", "test")


def test_modelshrink_dataset_artifact(tmp_path):
    with ArtifactWriter(tmp_path / "art") as writer:
        write_jsonl(writer.staging / "data.jsonl", ROWS)
        writer.commit(step="test", kind="dataset", options={}, parents=[])
    assert _read_all(tmp_path / "art") == EXPECTED


@pytest.mark.parametrize("columns, expected", [
    (["document", "summary", "id"], ("document", "summary")),
    (["article", "highlights"], ("article", "highlights")),
    (["dialogue", "summary"], ("dialogue", "summary")),
    (["text", "summary"], ("text", "summary")),
    (["sentence", "label"], ("sentence", None)),
])
def test_column_detection(columns, expected):
    assert pick_columns(columns) == expected


def test_explicit_columns_and_missing_ones():
    assert pick_columns(["body", "tldr"], text_column="body", summary_column="tldr") == ("body", "tldr")
    with pytest.raises(UserError, match="no text column; columns found: body, tldr"):
        pick_columns(["body", "tldr"])
    with pytest.raises(UserError, match="no column 'doc'; columns found: body, tldr"):
        pick_columns(["body", "tldr"], text_column="doc")
    with pytest.raises(UserError, match="no summary column"):
        pick_columns(["document"], need_summary=True)


def test_undecodable_line_names_its_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"document": "a"}\n{"document": "b"}\n{"document": \n')
    with pytest.raises(UserError, match="line 3 is not valid JSON"):
        list(open_data(path).rows())


def test_row_without_text(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"document": "a"}, {"document": None}])
    source = open_data(tmp_path / "a.jsonl")
    with pytest.raises(UserError, match="row 2 has no text"):
        list(examples(source, "document"))


def test_missing_unknown_and_non_utf8(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        open_data(tmp_path / "missing.jsonl")
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(UserError, match="unknown data format"):
        open_data(tmp_path / "a.txt")
    (tmp_path / "latin.jsonl").write_bytes('{"document": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        list(open_data(tmp_path / "latin.jsonl").rows())
    (tmp_path / "corrupt.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match="cannot read"):
        list(open_data(tmp_path / "corrupt.jsonl.gz").rows())
    (tmp_path / "plain").mkdir()
    with pytest.raises(UserError, match="neither a modelshrink dataset artifact"):
        open_data(tmp_path / "plain")


def test_a_folder_of_split_files_opens_by_split(tmp_path):
    """The layout of ../shared/data/debian-descriptions: train.jsonl.gz, validation.jsonl.gz side by side."""
    folder = tmp_path / "pairs"
    folder.mkdir()
    for split in ("train", "validation"):
        with gzip.open(folder / f"{split}.jsonl.gz", "wt") as f:
            f.write(json.dumps({"document": f"a {split} document", "summary": split}) + "\n")
    (folder / "README.md").write_text("not data")
    assert next(open_data(folder, "validation").rows())["summary"] == "validation"
    assert next(open_data(folder, "train").rows())["summary"] == "train"
    with pytest.raises(UserError, match="has splits train, validation; choose one with --split"):
        open_data(folder)
    with pytest.raises(UserError, match="no split 'test'"):
        open_data(folder, "test")
    single = tmp_path / "single"
    single.mkdir()
    write_jsonl(single / "test.jsonl", [{"document": "d", "summary": "s"}])
    assert next(open_data(single).rows())["document"] == "d"  # one file: no --split needed


def test_limit_and_ids_default_to_row_number(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"document": f"d{i}"} for i in range(4)])
    got = list(examples(open_data(tmp_path / "a.jsonl"), "document", limit=2))
    assert [(e.index, e.id, e.document, e.reference) for e in got] == [(0, "0", "d0", None), (1, "1", "d1", None)]


@pytest.mark.skipif(not (SHARED_DATA / "debian-descriptions").is_dir(), reason="../shared/data is absent")
def test_real_debian_descriptions_stream():
    source = open_data(SHARED_DATA / "debian-descriptions" / "validation.jsonl.gz")
    assert pick_columns(source.columns) == ("document", "summary")
    rows = list(examples(source, "document", "summary"))
    assert len(rows) == 2055 and all(r.document and r.reference for r in rows)


def test_an_unfinished_run_is_refused_as_input(tmp_path):
    """A staging folder, or a file inside one, holds rows of a run that has not finished."""
    staging = tmp_path / ".pl.partial"
    (staging / "parts").mkdir(parents=True)
    row = '{"id": 1, "document": "a b", "summary": "a"}\n'
    (staging / "parts" / "part-00000-of-00001.jsonl").write_text(row)
    (tmp_path / "rows.partial.jsonl").write_text(row)
    for given in (staging, staging / "parts", staging / "parts" / "part-00000-of-00001.jsonl",
                  tmp_path / "rows.partial.jsonl"):
        with pytest.raises(UserError, match="belongs to an unfinished run"):
            open_data(str(given))
    with pytest.raises(UserError, match="belongs to an unfinished run"):
        open_data(str(tmp_path), split="rows.partial")
    (tmp_path / "train.jsonl").write_text(row)
    assert open_data(str(tmp_path), split="train").columns == ["id", "document", "summary"]
