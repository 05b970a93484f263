"""Sequence classifiers: labelled data, batches, the distillation loss and validation.

Shared by `eval` (predictions), `quantize` (distillation-aware quantization of BERT-style
classifiers) and `contrastive`. Labels are class ids (or names the model's label2id knows) for
classification, numbers for regression.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from modelshrink.data import open_data
from modelshrink.errors import UserError
from modelshrink.runtime.columns import detect_text_column, text_problem


def read_labeled(spec: str, *, split: str | None = None, text_column: str | None = None,
                 text_pair_column: str | None = None, label_column: str | None = None, id_column: str | None = None,
                 limit: int | None = None, num_labels: int | None = None, label2id: dict[str, int] | None = None,
                 task: str = "classification") -> list[dict[str, Any]]:
    """Rows {id, text, text_pair, label}; one-line errors for missing columns and impossible labels."""
    source = open_data(spec, split)
    columns = source.columns
    if not columns:
        raise UserError(f"data {spec} has no rows")
    text_column = text_column or detect_text_column(columns)
    label_column = label_column or "label"
    if text_column is None:
        raise UserError(f"{spec} has no text column; columns found: {', '.join(columns)}; name one with --text-column")
    for name in (text_column, label_column, text_pair_column):
        if name is not None and name not in columns:
            raise UserError(f"{spec} has no column '{name}'; columns found: {', '.join(columns)}")
    label2id = {str(k): v for k, v in (label2id or {}).items()}
    rows = []
    for index, row in enumerate(source.rows()):
        if limit is not None and index >= limit:
            break
        label = row.get(label_column)
        if task == "classification":
            if isinstance(label, str) and label in label2id:
                label = label2id[label]
            if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or (
                    num_labels is not None and not 0 <= int(label) < num_labels):
                expected = f"the model predicts {num_labels} classes (0..{num_labels - 1})" if num_labels else \
                    "class ids"
                raise UserError(f"{spec}: row {index + 1} has label {label!r}; {expected}")
            label = int(label)
        elif not isinstance(label, (int, float)) or isinstance(label, bool):
            raise UserError(f"{spec}: row {index + 1} has label {label!r}; expected a number")
        for name in (text_column, text_pair_column):
            problem = name and text_problem(row, name)
            if problem:
                raise UserError(f"{spec}: row {index + 1} has no text: {problem}")
        ident = row.get(id_column) if id_column else row.get("id")
        rows.append({"id": str(index) if ident is None else str(ident), "text": row[text_column],
                     "text_pair": row[text_pair_column] if text_pair_column else None, "label": label})
    if not rows:
        raise UserError(f"data {spec} has no rows")
    return rows


def encode(rows: list[dict[str, Any]], tokenizer: Any, max_length: int | None = None) -> dict[str, torch.Tensor]:
    pairs = [r["text_pair"] for r in rows] if rows[0]["text_pair"] is not None else None
    return tokenizer([r["text"] for r in rows], pairs, truncation=True, padding=True, max_length=max_length,
                     return_tensors="pt")


def tokenize_labeled(rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> list[dict[str, Any]]:
    pairs = [r["text_pair"] for r in rows] if rows[0]["text_pair"] is not None else None
    enc = tokenizer([r["text"] for r in rows], pairs, truncation=True, max_length=max_length)
    out = []
    for i, r in enumerate(rows):
        example = {"input_ids": enc["input_ids"][i], "label": r["label"], "length": len(enc["input_ids"][i])}
        if "token_type_ids" in enc:
            example["token_type_ids"] = enc["token_type_ids"][i]
        out.append(example)
    return out


def make_collate(pad_id: int) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(b["input_ids"]) for b in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        types = torch.zeros((len(batch), width), dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            input_ids[i, :n] = torch.tensor(b["input_ids"])
            mask[i, :n] = 1
            if "token_type_ids" in b:
                types[i, :n] = torch.tensor(b["token_type_ids"])
        labels = torch.tensor([b["label"] for b in batch])
        out = {"input_ids": input_ids, "attention_mask": mask, "labels": labels, "tokens": int(mask.sum())}
        if "contrast" in batch[0]:  # classes for a contrastive loss (binned regression targets)
            out["contrast_labels"] = torch.tensor([b["contrast"] for b in batch])
        if "token_type_ids" in batch[0]:
            out["token_type_ids"] = types
        return out

    return collate


def make_loss(teacher: Any, kd_logits_weight: float, kd_hidden: float, kd_attention: float,
              layer_map: list[int], label_smoothing: float = 0.0):
    """Task loss (cross-entropy, or MSE for regression) plus MSE on logits, hidden states and
    attention against the teacher (DQ-BART's losses, on an encoder)."""
    from modelshrink.training import losses

    def loss_fn(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        out = model(**inputs, output_hidden_states=kd_hidden > 0, output_attentions=kd_attention > 0)
        if out.logits.shape[-1] == 1:
            task = torch.nn.functional.mse_loss(out.logits.squeeze(-1).float(), batch["labels"].float())
        else:
            task = torch.nn.functional.cross_entropy(out.logits.float(), batch["labels"],
                                                     label_smoothing=label_smoothing)
        total, parts = task, {"ce": task.detach()}
        if teacher is not None and (kd_logits_weight or kd_hidden or kd_attention):
            with torch.no_grad():
                t = teacher(**inputs, output_hidden_states=kd_hidden > 0, output_attentions=kd_attention > 0)
            if kd_logits_weight:
                kd = (out.logits.float() - t.logits.float()).pow(2).mean()
                total, parts["kd_logits"] = total + kd_logits_weight * kd, kd.detach()
            mask = batch["attention_mask"]
            if kd_hidden:
                hidden = losses.hidden_mse(out.hidden_states, t.hidden_states, layer_map, mask)
                total, parts["kd_hidden"] = total + kd_hidden * hidden, hidden.detach()
            if kd_attention:
                attention = losses.attention_mse(out.attentions, t.attentions, layer_map, mask, mask)
                total, parts["kd_attention"] = total + kd_attention * attention, attention.detach()
        parts["loss"] = total.detach()
        return total, parts

    return loss_fn


def predict(model: Any, tokenizer: Any, rows: list[dict[str, Any]], batch_size: int, device: Any,
            max_length: int | None = None) -> list[Any]:
    predictions: list[Any] = []
    for start in range(0, len(rows), batch_size):
        enc = encode(rows[start:start + batch_size], tokenizer, max_length)
        with torch.inference_mode():
            logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
        if logits.shape[-1] == 1:
            predictions += [float(x) for x in logits[:, 0].tolist()]
        else:
            predictions += [int(x) for x in logits.argmax(-1).tolist()]
    return predictions


def make_validate(rows: list[dict[str, Any]], tokenizer: Any, batch_size: int, device: Any,
                  max_length: int | None = None):
    from modelshrink.metrics import glue

    def validate(model: Any) -> dict[str, float]:
        predictions = predict(model, tokenizer, rows, batch_size, device, max_length)
        labels = [r["label"] for r in rows]
        if isinstance(predictions[0], float):
            return {k: round(v, 4) for k, v in glue.regression_metrics(predictions, labels).items()}
        return {k: round(v, 4) for k, v in glue.classification_metrics(predictions, labels).items()}

    return validate
