"""What a student reads and writes first, settled before training and saved with it: the task prefix in front of
each document (modelshrink.runtime.inputs) and, for a many-to-many translator (M2M100, NLLB, mBART-50), the language codes
that mark its sources and open its outputs (modelshrink.languages).

Each comes from the first of: the option given (--prefix, --target-lang, --source-lang), the labels the student
learns from (a pseudolabel artifact records the teacher's), the model itself (its config's prefix, the code its
generation config forces, the src_lang its tokenizer was saved with). The student's config then records the prefix,
its generation config forces the target code and its tokenizer marks sources and targets, so quantize, eval, export
and the runtime read the same input without being told again. A translator of many languages that none of these
names is refused in one line.
"""

from __future__ import annotations

from typing import Any, Callable

from modelshrink.artifacts import read_manifest
from modelshrink.data import open_data
from modelshrink.runtime.inputs import record_prefix, resolve_prefix
from modelshrink.languages import chosen_code, language_codes, set_target, source_language, target_language
from modelshrink.runtime.columns import pick_columns


def labels_resolved(data: str) -> dict[str, Any]:
    """What a pseudolabel artifact resolved when it labelled `data` (empty for plain data)."""
    manifest = read_manifest(data) if data else None
    return (manifest or {}).get("resolved", {}) if (manifest or {}).get("step") == "pseudolabel" else {}


def _translation_pairs(options: Any, labels: dict[str, Any]) -> bool:
    """Whether the documents are translation sources (the `source` column of pairs, or labels made from one)."""
    if labels:
        return labels.get("text_column") == "source"
    columns = open_data(options.data, options.split).columns
    text, _ = pick_columns(columns, options.text_column, options.summary_column, need_summary=True,
                           source=str(options.data))
    return text == "source"


def settle_reading(student: Any, tokenizer: Any, options: Any, what: str,
                   log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Settle and record the student's prefix and language codes (see the module); returns them as resolved."""
    labels = labels_resolved(options.data)
    generation = labels.get("generation", {})
    settled: dict[str, Any] = {}
    if language_codes(tokenizer):
        target = options.target_lang or generation.get("target_language")
        code = target_language(student, tokenizer, target, what)
        set_target(tokenizer, code)
        settled["target_language"] = code
        settled["source_language"] = source_language(tokenizer, options.source_lang
                                                     or generation.get("source_language"), what)
        log(f"{what} translates {settled['source_language'] or 'its source'} into {code}")
    else:
        for flag, value, one in (("--target-lang", options.target_lang, "translates into one language"),
                                 ("--source-lang", options.source_lang, "reads one language")):
            if value is not None:
                chosen_code({}, flag, value, what, one, names_rows=False)  # refused: no codes to choose from
    asked = options.prefix if options.prefix is not None else labels.get("prefix")
    prefix = resolve_prefix(asked, student.config, _translation_pairs(options, labels))
    record_prefix(student.config, prefix)
    if prefix:
        log(f"{what} reads each document behind the prefix {prefix!r}")
    settled["prefix"] = prefix
    return settled
