"""Reading JSON Lines (optionally gzip), the one reader of the steps and the runtime."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

from .errors import UserError


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSON Lines file, streamed; blank lines are skipped. A line that is not a JSON
    object, text that is not UTF-8, or an unreadable file is a UserError naming the line."""
    path = Path(path)
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else
              open(path, encoding="utf-8")) as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}: line {number} is not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise UserError(f"{path}: line {number} is a JSON {type(row).__name__}, expected an object "
                                    "with named columns")
                yield row
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
