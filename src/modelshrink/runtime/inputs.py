"""What a seq2seq model reads before the document: its task prefix ("summarize: "), resolved once and recorded in
the model.

T5 and FLAN-T5 were trained with the task written in front of the text, and their configs say which
(`task_specific_params.summarization.prefix = "summarize: "`, `translation_en_to_de`'s "translate English to German:
"); BART's configs carry `prefix = " "`. transformers' summarization pipeline (4.x) applied them: the task's
parameters over the config, then `config.prefix` in front of every document. `model_prefix` is that rule, and every
step that feeds documents to a model (pseudolabel, distill, quantize, eval, export's checks and the runtime)
writes `model_prefix(config)` in front of them, so teacher, student and ONNX folder read the same input. `--prefix`
overrides it ("" switches it off); `record_prefix` writes the choice into the model it makes, in both places the
rule reads, so the choice travels with the artifact (and a 4.x pipeline reads it too).

Translation pairs take no summarization prefix: a T5 translating English to German is told so with `--prefix
"translate English to German: "` (its config's `translation_en_to_de`), which `translation_prefixes` lists.

Plain Python (no torch): the runtime reads it too.
"""

from __future__ import annotations

from typing import Any, Iterable

SUMMARIZATION = "summarization"


def _get(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def model_prefix(config: Any, translation: bool = False) -> str:
    """The text a model (its config, or config.json as a dict) wants in front of each document, by the pipeline's
    rule: the summarization task's `prefix` where its `task_specific_params` name one, else `config.prefix`; for
    translation pairs `config.prefix` alone."""
    prefix = _get(config, "prefix")
    if not translation:
        task = (_get(config, "task_specific_params") or {}).get(SUMMARIZATION) or {}
        prefix = task.get("prefix", prefix)
    return prefix or ""


def translation_prefixes(config: Any) -> dict[str, str]:
    """The translation tasks a config declares a prefix for (T5's `translation_en_to_de` ...), by task."""
    tasks = _get(config, "task_specific_params") or {}
    return {name: task["prefix"] for name, task in tasks.items()
            if name.startswith("translation") and isinstance(task, dict) and task.get("prefix")}


def resolve_prefix(asked: str | None, config: Any, translation: bool = False) -> str:
    """--prefix when given (\"\" for none), else the model's own (`model_prefix`)."""
    return model_prefix(config, translation) if asked is None else asked


def record_prefix(config: Any, prefix: str) -> None:
    """Write `prefix` into a model's config so that `model_prefix` reads it back for any task: `config.prefix` and
    the summarization task's `prefix` where the config declares one (None where the prefix is empty and the config
    had none)."""
    config.prefix = prefix or (None if getattr(config, "prefix", None) is None else "")
    task = (getattr(config, "task_specific_params", None) or {}).get(SUMMARIZATION)
    if isinstance(task, dict) and "prefix" in task:
        task["prefix"] = prefix


def with_prefix(texts: Iterable[str], prefix: str) -> list[str]:
    """The texts as the model reads them."""
    return [prefix + text for text in texts] if prefix else list(texts)
