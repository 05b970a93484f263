"""Which column of a data file holds the text, and which the summary: one rule for every step and the runtime,
so that `run`, `eval`, `distill` and `pseudolabel` read the same column of the same file.

Named columns win. Otherwise the first (text, summary) pair present is taken; failing that, the first text
column present (documents before sentences; `sentence` before `question`, so QNLI's question/sentence pairs
read the sentence).

What counts as text (`text_problem`): a string with something besides white space in it and no unpaired UTF-16
surrogate (a broken "\\ud83d" escape, which no tokenizer or UTF-8 file accepts). A missing or null value, a
number, boolean, array or object is not text. Such a row is refused, not skipped: a row with no document is a
data bug to fix, and dropping it quietly would change what was trained or scored and shift the id of every
later row that has none. Summaries may be empty (a teacher can generate an empty one) but must be strings.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .errors import UserError
from .jsonl import json_type

# (text, summary) column pairs recognised without --text-column / --summary-column, in order.
COLUMN_PAIRS = (("document", "summary"), ("article", "highlights"), ("dialogue", "summary"), ("text", "summary"),
                ("source", "target"))  # translation pairs
TEXT_COLUMNS = ("document", "article", "dialogue", "text", "sentence", "sentence1", "question", "source")
ID_COLUMNS = ("id", "guid", "idx")


def text_problem(row: Mapping[str, Any], column: str, allow_empty: bool = False) -> str | None:
    """Why `row[column]` is not text a model can read ("column 'document' is null"), or None when it is."""
    if column not in row:
        return f"column '{column}' is missing"
    value = row[column]
    if value is None:
        return f"column '{column}' is null"
    if not isinstance(value, str):
        kind = json_type(value)
        return f"column '{column}' holds {'an' if kind[0] in 'aeiou' else 'a'} {kind}, expected a string"
    if not allow_empty and (not value or value.isspace()):
        return f"column '{column}' is empty"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:  # only a surrogate fails: every other code point has UTF-8 bytes
            return (f"column '{column}' holds an unpaired surrogate \\u{ord(value[e.start]):04x} at character "
                    f"{e.start + 1} (a broken \\u escape), which is not text")
    return None


def detect_text_column(columns: Sequence[str], summary_given: bool = False) -> str | None:
    """The text column found by name, or None. With `summary_given` (the summary column was named), a pair's
    text column counts without its summary."""
    for text, summary in COLUMN_PAIRS:
        if text in columns and (summary_given or summary in columns):
            return text
    return next((c for c in TEXT_COLUMNS if c in columns), None)


def detect_summary_column(columns: Sequence[str], text_column: str) -> str | None:
    """The summary column paired with `text_column`, or None."""
    return next((s for t, s in COLUMN_PAIRS if t == text_column and s in columns), None)


def pick_columns(columns: Sequence[str], text_column: str | None = None, summary_column: str | None = None,
                 need_summary: bool = False, source: str = "data", text_option: str = "--text-column",
                 summary_option: str = "--summary-column") -> tuple[str, str | None]:
    """Choose the text and summary columns, explicitly or by the usual pairs. `text_option` and
    `summary_option` are the command-line options that name them, for the error messages."""
    found = ", ".join(columns) if columns else "none"
    if text_column is not None and text_column not in columns:
        raise UserError(f"{source} has no column '{text_column}'; columns found: {found}")
    if summary_column is not None and summary_column not in columns:
        raise UserError(f"{source} has no column '{summary_column}'; columns found: {found}")
    if text_column is None:
        text_column = detect_text_column(columns, summary_given=summary_column is not None)
        if text_column is None:
            raise UserError(f"{source} has no text column; columns found: {found}; name one with {text_option}")
    if summary_column is None:
        summary_column = detect_summary_column(columns, text_column)
    if need_summary and summary_column is None:
        raise UserError(f"{source} has no summary column; columns found: {found}; name one with {summary_option}")
    return text_column, summary_column
