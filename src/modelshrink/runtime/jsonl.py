"""Reading text data files line by line (plain or gzip): the lines under every JSON Lines and CSV reader of
the steps and the runtime, and the JSON Lines reader itself.

What every line-based file gets:
- a UTF-8 byte order mark at the start is dropped, so the first column is never "\\ufeffdocument";
- CRLF and CR line ends read as LF: no value keeps a trailing "\\r";
- lines of any length are read (a line of several megabytes is one line);
- bytes that are not UTF-8, and gzip data that is damaged or ends early, are a UserError naming the file and
  the line, e.g. "docs.jsonl: line 7 is not UTF-8 text (byte 0xe9 at character 12)".

In JSON Lines, blank lines are skipped; every other line must be one JSON object, or it is a UserError naming
the line ("line 3 is not valid JSON (...)", "line 4 is a JSON array, expected an object ...").
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Any, Iterator

from .errors import UserError


def _open_text(path: Path) -> io.TextIOBase:
    # utf-8-sig drops a leading byte order mark; newline=None reads CRLF and CR as LF.
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="surrogateescape", newline=None)
    return open(path, encoding="utf-8-sig", errors="surrogateescape", newline=None)


def _check_decoded(path: Path, number: int, line: str) -> None:
    # With errors="surrogateescape" each byte that is not UTF-8 decodes to a surrogate (U+DC80..U+DCFF), and
    # valid UTF-8 never decodes to one, so the line fails to encode back exactly where a bad byte was.
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{path}: line {number} is not UTF-8 text (byte 0x{ord(line[e.start]) - 0xDC00:02x} at "
                        f"character {e.start + 1})") from None


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, line with its "\\n") for each line of a UTF-8 text file, gzip when named .gz.
    Raises UserError naming the line for bytes that are not UTF-8, damaged gzip data and read failures."""
    path = Path(path)
    number = 0
    try:
        with _open_text(path) as f:
            for number, line in enumerate(f, start=1):
                if not line.isascii():
                    _check_decoded(path, number, line)
                yield number, line
    except EOFError:
        raise UserError(f"cannot read {path}: the gzip data ends early, {_after(number)} (a truncated file?)") \
            from None
    except (OSError, zlib.error) as e:
        if path.name.endswith(".gz") and not isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError):
            raise UserError(f"cannot read {path}: damaged gzip data {_after(number)} ({e})") from None
        raise UserError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _after(number: int) -> str:
    return f"after line {number}" if number else "before its first line"


def json_type(value: Any) -> str:
    """The JSON name of a value's type: null, boolean, number, string, array, object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _parse_line(path: Path, number: int, line: str) -> dict[str, Any]:
    # A whole-file JSON array ("[{...}, {...}]") is the usual mistake behind a first line that is not an object.
    hint = ("; modelshrink reads JSON Lines (one object per line), not a JSON array"
            if number == 1 and line.lstrip().startswith("[") else "")
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: line {number} is not valid JSON ({e.msg} at character {e.colno}){hint}") from None
    except RecursionError:
        raise UserError(f"{path}: line {number} is not valid JSON (nested too deeply)") from None
    except ValueError as e:  # a number of more than 4300 digits
        raise UserError(f"{path}: line {number} is not valid JSON ({e})") from None
    if not isinstance(row, dict):
        raise UserError(f"{path}: line {number} is a JSON {json_type(row)}, expected an object with named "
                        f"columns{hint}")
    return row


def numbered_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for each row of a JSON Lines file (.gz too), streamed; blank lines are skipped."""
    path = Path(path)
    for number, line in text_lines(path):
        # A byte order mark inside the file is where BOM-marked files were concatenated (cat a.jsonl b.jsonl).
        line = line.lstrip("\ufeff")
        if line.strip():
            yield number, _parse_line(path, number, line)


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSON Lines file (.gz too), streamed; see the module docstring for what is refused."""
    for _, row in numbered_jsonl(path):
        yield row
