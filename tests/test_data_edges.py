"""Real-world bad input to the dataset readers: every file either reads as documented or fails with one
UserError naming the file and the line (the row, for Parquet and `datasets`), never a traceback."""

from __future__ import annotations

import csv
import gzip
import io
import json
import random

import pytest
from typer.testing import CliRunner

from conftest import write_jsonl
from modelshrink.artifacts import staging_path
from modelshrink.cli import app
from modelshrink.data import examples, open_data, pick_columns
from modelshrink.errors import UserError
from modelshrink.runtime.jsonl import read_jsonl

BOM = b"\xef\xbb\xbf"


def write_bytes(path, data: bytes):
    """`data` at `path`, gzip-compressed when the name ends in .gz."""
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def read_pairs(path):
    """[(document, summary)] read as every step reads them: columns found by name, then `examples`."""
    source = open_data(path)
    text, summary = pick_columns(source.columns)
    return [(e.document, e.reference) for e in examples(source, text, summary)]


def cut_gzip(data: bytes) -> bytes:
    """`data` gzip-compressed, then cut in half: a download that stopped early."""
    packed = gzip.compress(data)
    return packed[:len(packed) // 2]


def refused(path, pattern, summary=True):
    """Reading `path` (its document and summary columns, or with `summary=False` its document column only)
    raises one UserError that matches `pattern` and is one line naming the file."""
    with pytest.raises(UserError, match=pattern) as caught:
        if summary:
            read_pairs(path)
        else:
            list(examples(open_data(path), "document"))
    assert str(path) in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


# ---------------------------------------------------------------- text and summary values

NOT_TEXT = {
    "empty": ('""', "is empty"),
    "white space": ('" \\t "', "is empty"),
    "null": ("null", "is null"),
    "number": ("3", "holds a number"),
    "float": ("1.5", "holds a number"),
    "NaN": ("NaN", "holds a number"),
    "boolean": ("true", "holds a boolean"),
    "array": ("[1, 2]", "holds an array"),
    "object": ('{"text": "x"}', "holds an object"),
    "broken escape": ('"half an emoji \\ud83d"', r"holds an unpaired surrogate \\ud83d at character 15"),
}


@pytest.mark.parametrize("value, problem", NOT_TEXT.values(), ids=NOT_TEXT.keys())
def test_a_row_without_text_is_refused_with_its_line_and_row(tmp_path, value, problem):
    # A blank line first, so that line (3) and row (2) differ and the message must get both right.
    path = tmp_path / "docs.jsonl"
    path.write_text(f'{{"document": "fine"}}\n\n{{"document": {value}}}\n')
    refused(path, rf"docs.jsonl: line 3, row 2 has no text: column 'document' {problem}", summary=False)


def test_a_row_missing_the_text_column_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"document": "a", "summary": "b"}, {"summary": "c"}])
    refused(path, "line 2, row 2 has no text: column 'document' is missing")


@pytest.mark.parametrize("value, problem", [("null", "is null"), ("7", "holds a number"),
                                            ('["a"]', "holds an array")])
def test_a_summary_that_is_not_a_string_is_refused(tmp_path, value, problem):
    path = tmp_path / "pairs.jsonl"
    path.write_text(f'{{"document": "a", "summary": "b"}}\n{{"document": "c", "summary": {value}}}\n')
    refused(path, rf"line 2, row 2 has no summary: column 'summary' {problem}")


def test_an_empty_summary_is_kept(tmp_path):
    """A teacher can generate an empty summary; its pseudolabels must still train and score."""
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"document": "a", "summary": ""}])
    assert read_pairs(path) == [("a", "")]


def test_rows_of_parquet_and_datasets_are_named_by_row(tmp_path):
    import datasets

    rows = [{"document": "a", "summary": "x"}, {"document": None, "summary": "y"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    refused(tmp_path / "d.parquet", r"d.parquet: row 2 has no text: column 'document' is null")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    refused(tmp_path / "saved", r"saved: row 2 has no text: column 'document' is null")


# ---------------------------------------------------------------- what just works

PAIRS = [("first document", "first summary"), ("second, with a comma", "second summary")]


def _jsonl(newline: str) -> bytes:
    return "".join(json.dumps({"document": d, "summary": s}) + newline for d, s in PAIRS).encode()


def _csv(newline: str, delimiter: str = ",") -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator=newline)
    writer.writerow(["document", "summary"])
    writer.writerows(PAIRS)
    return out.getvalue().encode()


FORMATS = {"a.jsonl": _jsonl, "a.jsonl.gz": _jsonl, "a.csv": _csv, "a.csv.gz": _csv,
           "a.tsv": lambda newline: _csv(newline, "\t")}


@pytest.mark.parametrize("name", FORMATS)
def test_a_byte_order_mark_is_dropped(tmp_path, name):
    path = write_bytes(tmp_path / name, BOM + FORMATS[name]("\n"))
    assert open_data(path).columns == ["document", "summary"]
    assert read_pairs(path) == PAIRS


@pytest.mark.parametrize("name", FORMATS)
def test_crlf_line_ends_leave_no_carriage_return(tmp_path, name):
    path = write_bytes(tmp_path / name, FORMATS[name]("\r\n"))
    assert read_pairs(path) == PAIRS


def test_bom_and_crlf_reach_the_runtime_reader_too(tmp_path):
    path = write_bytes(tmp_path / "a.jsonl", BOM + _jsonl("\r\n"))
    assert [(r["document"], r["summary"]) for r in read_jsonl(path)] == PAIRS


def test_a_quoted_csv_field_keeps_its_line_break_without_the_carriage_return(tmp_path):
    path = write_bytes(tmp_path / "a.csv", b'document,summary\r\n"two\r\nlines",s\r\nnext,t\r\n')
    assert read_pairs(path) == [("two\nlines", "s"), ("next", "t")]


@pytest.mark.parametrize("name", ["big.jsonl", "big.csv", "big.jsonl.gz"])
def test_a_line_of_several_megabytes_reads(tmp_path, name):
    document = "word " * 1_200_000  # 6 MB
    rows = [{"document": document, "summary": "long"}, {"document": "short", "summary": "s"}]
    if ".csv" in name:
        data = ("document,summary\n" + "".join(f"{r['document']},{r['summary']}\n" for r in rows)).encode()
    else:
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    assert read_pairs(write_bytes(tmp_path / name, data)) == [(document, "long"), ("short", "s")]


def test_blank_lines_are_skipped_and_ids_count_rows(tmp_path):
    path = write_bytes(tmp_path / "a.jsonl", b'\n{"document": "a"}\n  \n\t\n{"document": "b"}\n\n')
    got = [(e.index, e.id, e.document) for e in examples(open_data(path), "document")]
    assert got == [(0, "0", "a"), (1, "1", "b")]


def test_byte_order_marks_of_concatenated_files_are_dropped(tmp_path):
    """`cat a.jsonl b.jsonl` of two files saved with a BOM puts one at the start of a line."""
    path = write_bytes(tmp_path / "a.jsonl", BOM + b'{"document": "a"}\n' + BOM + b'{"document": "b"}\n')
    assert [e.document for e in examples(open_data(path), "document")] == ["a", "b"]


# ---------------------------------------------------------------- damaged files

NOT_UTF8 = {"bad.jsonl": (b'{"document": "a"}\n\n{"document": "caf\xe9"}\n', "line 3", "character 18"),
            "bad.jsonl.gz": (b'{"document": "a"}\r\n{"document": "\xff"}\r\n', "line 2", "character 15"),
            "bad.csv": (b'document\r\na\r\n"two\r\nlines \xe9"\r\n', "line 4", "character 7")}


@pytest.mark.parametrize("name", NOT_UTF8)
def test_bytes_that_are_not_utf8_name_their_line(tmp_path, name):
    data, line, character = NOT_UTF8[name]
    path = write_bytes(tmp_path / name, data)
    refused(path, rf"{name}: {line} is not UTF-8 text \(byte 0x(e9|ff) at {character}\)$", summary=False)


@pytest.mark.parametrize("line, kind", [("[1, 2]", "array"), ("3", "number"), ('"x"', "string"),
                                        ("null", "null"), ("true", "boolean")])
def test_a_json_line_that_is_not_an_object_is_refused(tmp_path, line, kind):
    path = write_bytes(tmp_path / "a.jsonl", f'{{"document": "a"}}\n{line}\n'.encode())
    refused(path, rf"a.jsonl: line 2 is a JSON {kind}, expected an object with named columns$", summary=False)


@pytest.mark.parametrize("line, reason", [('{"document": "a"', r"Expecting ',' delimiter"),
                                          ('{"document": "a"} trailing', "Extra data"),
                                          ("{'document': 'a'}", "Expecting property name"),
                                          ('{"document": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                           "nested too deeply"),
                                          ('{"document": "a", "n": ' + "1" * 5000 + "}", "digits")])
def test_malformed_json_names_its_line(tmp_path, line, reason):
    path = write_bytes(tmp_path / "a.jsonl", f'{{"document": "a"}}\n{line}\n'.encode())
    refused(path, rf"line 2 is not valid JSON \(.*{reason}", summary=False)


def test_a_json_array_file_gets_a_hint(tmp_path):
    path = write_bytes(tmp_path / "a.json", b'[{"document": "a"}, {"document": "b"}]\n')
    refused(path, "line 1 is a JSON array.*reads JSON Lines", summary=False)


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.csv.gz"])
def test_a_truncated_gzip_file_is_refused(tmp_path, name):
    rows = [{"document": f"document number {i} " + "x" * (i % 97), "summary": str(i)} for i in range(3000)]
    if name.endswith(".csv.gz"):
        data = ("document,summary\n" + "".join(f"{r['document']},{r['summary']}\n" for r in rows)).encode()
    else:
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / name).write_bytes(cut_gzip(data))
    refused(tmp_path / name, r"cannot read .*: the gzip data ends early, after line \d+ \(a truncated file\?\)")


def test_a_damaged_or_fake_gzip_file_is_refused(tmp_path):
    (tmp_path / "fake.jsonl.gz").write_bytes(b"plain text, not gzip\n")
    refused(tmp_path / "fake.jsonl.gz", "cannot read .*damaged gzip data before its first line")


@pytest.mark.parametrize("row, fields", [("c,d,e", "3 fields"), ("c", "1 field")])
def test_a_ragged_csv_row_is_refused(tmp_path, row, fields):
    path = write_bytes(tmp_path / "a.csv", f"document,summary\na,b\n\n{row}\n".encode())
    refused(path, rf"a.csv: line 4 has {fields}; the header has 2 fields$")


def test_an_unclosed_csv_quote_names_the_line_it_opens(tmp_path):
    path = write_bytes(tmp_path / "a.csv", b'document,summary\na,b\n"never closed,c\nd,e\n')
    refused(path, r"a.csv: line 3 is not valid CSV \(unexpected end of data\)")


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path):
    path = write_bytes(tmp_path / "a.csv", b"document,document\na,b\n")
    refused(path, "line 1, the header, names column 'document' twice", summary=False)


EMPTY = {"empty.jsonl": b"", "blank.jsonl": b"\n \n\r\n", "bom.jsonl": BOM, "empty.jsonl.gz": b"",
         "empty.csv": b"", "header.csv": b"document,summary\r\n", "header.tsv.gz": BOM + b"document\tsummary\n"}


@pytest.mark.parametrize("name", EMPTY)
def test_a_file_with_no_rows_is_refused(tmp_path, name):
    path = write_bytes(tmp_path / name, EMPTY[name])
    with pytest.raises(UserError) as caught:
        read_pairs(path)
    assert str(caught.value) == f"{path} has no rows"


def test_empty_and_damaged_parquet_and_datasets_folders(tmp_path):
    import datasets

    empty = datasets.Dataset.from_list([{"document": "a"}]).select([])
    empty.to_parquet(str(tmp_path / "empty.parquet"))
    refused(tmp_path / "empty.parquet", "empty.parquet has no rows$")
    empty.save_to_disk(str(tmp_path / "empty"))  # datasets itself cannot load this back
    refused(tmp_path / "empty", "empty has no rows$")
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 not parquet")
    refused(tmp_path / "fake.parquet", "cannot read .*fake.parquet: Parquet magic bytes not found")
    datasets.Dataset.from_list([{"document": "a"}]).save_to_disk(str(tmp_path / "damaged"))
    for arrow in (tmp_path / "damaged").glob("*.arrow"):
        arrow.write_bytes(b"not arrow")
    refused(tmp_path / "damaged", "cannot read .*damaged as a `datasets` save_to_disk folder")


# ---------------------------------------------------------------- fuzz

KEYS = ["document", "summary", "text", "id", "label", "\ufeffdocument", "", "x"]


def _random_string(rng: random.Random, letters: str = "ab \t\r\n,\"'\\{}[]é€\u2028\x00😀") -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(0, 12)))


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["str", "str", "str", "surrogate", "empty", "null", "int", "float", "bool", "list", "dict"])
    if depth > 2 or kind == "str":
        return _random_string(rng)
    return {"surrogate": _random_string(rng) + "\ud83d", "empty": "", "null": None, "int": rng.randint(-5, 10**30),
            "float": rng.choice([0.5, float("nan")]), "bool": rng.random() < 0.5,
            "list": [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))],
            "dict": {rng.choice(KEYS): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}}[kind]


def _random_rows(rng: random.Random) -> list[dict]:
    """Rows of random keys; in half the files every value is a non-empty string, so that most of those read."""
    keys = rng.sample(KEYS, rng.randint(1, 4))
    if rng.random() < 0.5:
        keys = list(dict.fromkeys([rng.choice(["document", "text"]), *keys]))
        return [{k: "x" + _random_string(rng) for k in keys} for _ in range(rng.randint(1, 6))]
    return [{k: _random_value(rng) for k in keys if rng.random() < 0.9} for _ in range(rng.randint(0, 6))]


def _random_csv(rng: random.Random, rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, delimiter=rng.choice([",", "\t"]), lineterminator=rng.choice(["\n", "\r\n"]))
    header = sorted({k for r in rows for k in r}) or ["document"]
    writer.writerow(header)
    for row in rows:
        cells = [str(row.get(k, "")) for k in header]
        if rng.random() < 0.15:  # a ragged row
            cells = cells[:-1] if rng.random() < 0.5 else cells + ["extra"]
        writer.writerow(cells)
    return out.getvalue()


def _random_jsonl(rng: random.Random, rows: list[dict]) -> str:
    lines = [json.dumps(r, ensure_ascii=rng.random() < 0.5) if rng.random() < 0.9 else rng.choice(["[1]", "", "{"])
             for r in rows]
    return rng.choice(["\n", "\r\n"]).join(lines)


def _random_file(rng: random.Random) -> tuple[str, bytes]:
    """(file name, bytes): random bytes, random JSON rows, random CSV cells, or either with bytes flipped."""
    kind = rng.choice(["bytes", "rows", "rows", "flipped"])
    name = rng.choice(["f.jsonl", "f.csv", "f.tsv", "f.jsonl.gz", "f.csv.gz"])
    if kind == "bytes":
        alphabet = b'{}[]",:\n\r\t abc\\\xef\xbb\xbf\xe9\xff\x00\x1f\x8b'
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
    else:
        rows = _random_rows(rng)
        text = _random_csv(rng, rows) if ".csv" in name or ".tsv" in name else _random_jsonl(rng, rows)
        # surrogatepass: a raw lone surrogate (ensure_ascii=False) becomes bytes that are not UTF-8
        raw = (BOM if rng.random() < 0.2 else b"") + text.encode("utf-8", "surrogatepass")
    if name.endswith(".gz"):
        raw = gzip.compress(raw)
    if kind == "flipped" and raw:
        flipped = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        raw = bytes(flipped[:rng.randint(len(flipped) // 2, len(flipped))])
    return name, raw


def test_fuzz_every_input_reads_or_is_a_user_error(tmp_path):
    rng = random.Random(14)
    outcomes = {"read": 0, "refused": 0}
    for case in range(240):
        name, raw = _random_file(rng)
        path = tmp_path / f"{case}-{name}"
        path.write_bytes(raw)
        try:
            source = open_data(path)
            text, summary = pick_columns(source.columns)
            for example in examples(source, text, summary):
                assert isinstance(example.document, str) and example.document.strip() and "\ufeff" not in text
                if ".csv" in name or ".tsv" in name:  # in JSON, an escaped "\r" is part of the text
                    assert "\r" not in example.document
        except UserError as e:
            assert "\n" not in str(e), str(e)
            outcomes["refused"] += 1
        else:
            outcomes["read"] += 1
    assert outcomes["read"] >= 10 and outcomes["refused"] >= 10, outcomes  # both paths exercised


# ---------------------------------------------------------------- through the command line

runner = CliRunner()


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert all(f in lines[0] for f in fragments), lines[0]
    assert result.stdout == "" and "Traceback" not in result.stderr


BAD_DATA = {
    "empty text": ("docs.jsonl", b'{"document": "a", "summary": "s"}\n\n{"document": "", "summary": "t"}\n',
                   ["docs.jsonl: line 3, row 2 has no text: column 'document' is empty"]),
    "not utf-8": ("docs.csv", b"document,summary\na,b\ncaf\xe9,c\n", ["docs.csv: line 3 is not UTF-8 text"]),
    "not an object": ("docs.jsonl", b'{"document": "a", "summary": "s"}\n[1, 2]\n',
                      ["docs.jsonl: line 2 is a JSON array"]),
    "truncated gzip": ("docs.jsonl.gz", cut_gzip(b"".join(b'{"document": "doc %d", "summary": "s"}\n' % i
                                                          for i in range(5000))),
                       ["docs.jsonl.gz", "the gzip data ends early"]),
    "ragged csv": ("docs.csv", b"document,summary\na,b\nc,d,e\n", ["docs.csv: line 3 has 3 fields"]),
    "no rows": ("docs.jsonl", b"\n\n", ["docs.jsonl has no rows"]),
}


@pytest.mark.parametrize("command", ["pseudolabel", "eval"])
@pytest.mark.parametrize("case", BAD_DATA)
def test_bad_data_is_one_line_exit_1_nothing_written(tmp_path, saved_models, command, case):
    name, data, fragments = BAD_DATA[case]
    (tmp_path / name).write_bytes(data)
    out = tmp_path / "out"
    result = runner.invoke(app, [command, str(saved_models["bart"]), str(tmp_path / name), "-o", str(out),
                                 "--device", "cpu"])
    assert_one_line_error(result, *fragments)
    assert not out.exists() and not staging_path(out).exists()


def test_bom_and_crlf_csv_pseudolabels(tmp_path, saved_models):
    path = write_bytes(tmp_path / "docs.csv", BOM + _csv("\r\n"))
    out = tmp_path / "pl"
    result = runner.invoke(app, ["pseudolabel", str(saved_models["bart"]), str(path), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
    assert [(r["document"], r["reference"]) for r in rows] == PAIRS
