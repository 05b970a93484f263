"""The YAML front matter that opens every model artifact's README.md, as the Hugging Face Hub reads a model card.

The Hub shows "no model card metadata" for a card without it and cannot link the base model, the task or the
library. Each model step writes its card's text; `ArtifactWriter.commit` opens it with this metadata, drawn
from what the manifest records (the step, its options, the model's config): `library_name`, `pipeline_tag`
(summarization, translation or text-classification), `base_model` (the teacher, warm start, student or model
the step started from, as given), `tags` (modelshrink, the step's method) and `datasets` where the data is a
hub dataset name rather than a local path.

Once `eval` has scored a model artifact, `add_results` writes a `model-index` into the card's metadata: the
metrics (ROUGE, BLEU and chrF, or the classifier's), the task and the data they were measured on, one entry
a (task, data, split), replaced when the same data is scored again. The card is the one file of an artifact
that a later step writes, which is why the manifest pins every file but README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelshrink.artifacts import CARD_NAME
from modelshrink.families import TRANSLATION_TYPES
from modelshrink.metrics.names import RESULT_METRICS

METHOD_TAGS = {"distill": ["distillation"], "quantize": ["quantization", "dq-bart"],
               "contrastive": ["distillation", "ackd", "contrastive-distillation"], "export": ["onnx"],
               "warmstart": ["warm-start"]}
# where each step's model came from, in order of preference
BASE_OPTIONS = ("teacher", "init_encoder_decoder", "student", "model")


def _pipeline_tag(config: dict[str, Any], options: dict[str, Any]) -> str:
    if any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or []) \
            or "num_labels" in options or config.get("problem_type"):
        return "text-classification"
    if config.get("model_type") in TRANSLATION_TYPES:
        return "translation"
    data = options.get("data")
    if isinstance(data, str) and Path(data).exists():
        try:
            from modelshrink.artifacts import read_manifest
            from modelshrink.data import open_data
            from modelshrink.runtime.columns import detect_text_column

            labels = read_manifest(Path(data)) if Path(data).is_dir() else None  # teacher labels of source rows?
            column = (labels or {}).get("resolved", {}).get("text_column") or detect_text_column(open_data(data).columns)
            if column == "source":
                return "translation"
        except Exception:  # a card never fails a finished run: the task falls back to the family's usual one
            pass
    return "summarization"


def metadata(step: str, options: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The card's metadata for a model made by `step` with `options` (the manifest's) and `config` (config.json)."""
    tags = ["modelshrink", *METHOD_TAGS.get(step, [])]
    if config.get("model_type"):
        tags.append(config["model_type"])
    pipeline = _pipeline_tag(config, options)
    data: dict[str, Any] = {"library_name": "onnxruntime" if step == "export" else "transformers",
                            "pipeline_tag": pipeline, "tags": tags}
    base = next((options[k] for k in BASE_OPTIONS if isinstance(options.get(k), str)), None)
    if base:
        data["base_model"] = base
    dataset = options.get("data")
    if isinstance(dataset, str) and not Path(dataset).exists() and "/" in dataset.strip("/"):
        data["datasets"] = [dataset]  # a hub dataset name (a local file or folder is no dataset id)
    return data


def front_matter(data: dict[str, Any]) -> str:
    from huggingface_hub import ModelCardData

    return f"---\n{ModelCardData(**data).to_yaml()}\n---\n"


def open_card(folder: Path, step: str, options: dict[str, Any]) -> None:
    """Open `folder`'s README.md with the Hub's metadata (replacing any front matter it has)."""
    card = folder / "README.md"
    if not card.is_file():
        return
    text = card.read_text(encoding="utf-8")
    if text.startswith("---\n"):  # a card that wrote its own (export's): this one replaces it
        end = text.find("\n---\n", 4)
        text = text[end + 5:] if end != -1 else text
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    card.write_text(front_matter(metadata(step, options, config)) + text.lstrip("\n"), encoding="utf-8")


def commit_model(writer: Any, *, step: str, options: dict[str, Any], parents: list[dict[str, Any]],
                 metrics: dict[str, Any] | None = None, resolved: dict[str, Any] | None = None) -> Path:
    """Commit a model artifact (`ArtifactWriter.commit`, kind "model") with its card opened by the Hub's metadata."""
    open_card(writer.staging, step, options)
    return writer.commit(step=step, kind="model", options=options, parents=parents, metrics=metrics,
                         resolved=resolved)


def _dataset_id(data: str) -> str:
    """A hub dataset's name as given; a local file or folder by its name (the Hub needs some id)."""
    path = Path(data)
    return path.name if path.exists() else data


def add_results(folder: Path, *, task: str, data: str, split: str | None, metrics: dict[str, Any],
                limit: int | None = None) -> bool:
    """Put eval's `metrics` of the model in `folder` on `data` (its first `limit` rows, where given) into its card's
    `model-index`, replacing an earlier entry for the same task, data and split. False where the folder has no
    card with front matter."""
    from huggingface_hub import EvalResult, ModelCard

    path = Path(folder) / CARD_NAME
    if not path.is_file() or not path.read_text(encoding="utf-8").startswith("---\n"):
        return False
    card = ModelCard.load(path)
    pipeline = task if task in ("summarization", "translation") else "text-classification"
    dataset = _dataset_id(data)
    kept = [r for r in card.data.eval_results or []
            if (r.task_type, r.dataset_type, r.dataset_split) != (pipeline, dataset, split)]
    described = dataset if limit is None else f"{dataset} (first {limit} rows)"
    new = [EvalResult(task_type=pipeline, dataset_type=dataset, dataset_name=described, dataset_split=split,
                      metric_type=kind, metric_name=shown, metric_value=metrics[key])
           for key, (kind, shown) in RESULT_METRICS.items()
           if isinstance(metrics.get(key), (int, float)) and not isinstance(metrics.get(key), bool)]
    if not new:
        return False
    card.data.eval_results = kept + new
    card.data.model_name = card.data.model_name or Path(folder).resolve().name
    card.save(path)
    return True
