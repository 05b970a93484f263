"""`quantize --budget-mb` inside the step: the calibration objective of each kind of model, and the plan made (or,
resuming, read back) before training. The measurement and the allocation are `quant/budget.py`'s."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from modelshrink.options.quantize import QuantizeOptions
from modelshrink.quant.budget import MB, PLAN_NAME, Plan, apply_plan, batched, calibration_rows, plan_bits, smallest_bytes
from modelshrink.quant.modules import quantize_model
from modelshrink.quant.spec import QuantSpec, check_budget_spec, parse_candidates

Objective = tuple[list[Any], Callable[[Any], Any], Callable[[Any, Any, Any], torch.Tensor]]


def _on(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def seq2seq_objective(rows: list[Any], tokenizer: Any, teacher: Any, max_source_length: int, max_target_length: int,
                      batch_size: int, device: Any, vocab_map: list[int] | None = None, prefix: str = "") -> Objective:
    """(batches, teacher logits of a batch, loss of a model on a batch given them): cross-entropy on the reference
    plus the MSE to the teacher's logits on the target tokens. A trimmed student's batch (`vocab_map`: the
    teacher's id of each of its ids) is read by the teacher in its own ids, its logits taken at the student's."""
    from modelshrink.training import losses
    from modelshrink.training.seq2seq import decoder_inputs, make_collate, tokenize_pairs

    collate = make_collate(tokenizer.pad_token_id)
    tokenized = tokenize_pairs(rows, tokenizer, max_source_length, max_target_length, prefix)
    batches = [_on(collate(chunk), device) for chunk in batched(tokenized, batch_size)]

    def logits(model: Any, batch: dict[str, Any]) -> torch.Tensor:
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     decoder_input_ids=decoder_inputs(model, batch["labels"]), use_cache=False).logits

    def loss(model: Any, batch: dict[str, Any], target: torch.Tensor) -> torch.Tensor:
        out = logits(model, batch)
        return (losses.label_smoothed_cross_entropy(out, batch["labels"])
                + losses.kd_mse(out, target, (batch["labels"] != -100).long()))

    def targets(batch: dict[str, Any]) -> torch.Tensor:
        if vocab_map is None:
            return logits(teacher, batch)
        from modelshrink.models.vocabulary import in_teacher_ids

        index = torch.tensor(vocab_map, dtype=torch.long, device=batch["input_ids"].device)
        mapped = {**batch, **{k: in_teacher_ids(index, batch[k]) for k in ("input_ids", "labels")}}
        return logits(teacher, mapped).index_select(-1, index)

    return batches, targets, loss


def classifier_objective(examples: list[dict[str, Any]], pad_id: int, teacher: Any, batch_size: int,
                         device: Any) -> Objective:
    """The same for a classifier: the task loss (cross-entropy, or MSE for regression) plus the logits' MSE."""
    from modelshrink.training.classify import make_collate

    collate = make_collate(pad_id)
    batches = [_on(collate(chunk), device) for chunk in batched(examples, batch_size)]

    def logits(model: Any, batch: dict[str, Any]) -> torch.Tensor:
        return model(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}).logits

    def loss(model: Any, batch: dict[str, Any], target: torch.Tensor) -> torch.Tensor:
        out = logits(model, batch).float()
        if out.shape[-1] == 1:
            task = torch.nn.functional.mse_loss(out.squeeze(-1), batch["labels"].float())
        else:
            task = torch.nn.functional.cross_entropy(out, batch["labels"])
        return task + (out - target.float()).pow(2).mean()

    return batches, lambda batch: logits(teacher, batch), loss


def quantize_within_budget(options: QuantizeOptions, student: Any, objective: Callable[[list[Any]], Objective],
                           rows: list[Any], staging: Path | None, log: Callable[[str], None],
                           accelerator: Any = None) -> tuple[QuantSpec, Plan, dict[str, int]]:
    """Quantize `student` in place with the bits a plan gives it: read back from `staging` (a resumed run) or made
    now by measuring on a seeded sample of `rows`. Returns (the spec the plan amounts to, the plan, counts).
    Under a launcher the main process plans and every other one takes its plan, so all train the same bits."""
    spec = options.spec
    check_budget_spec(spec)
    candidates = parse_candidates(options.candidate_bits)
    counts = quantize_model(student, spec)
    budget = int(options.budget_mb * MB)
    export = options.budget_of == "export"
    smallest_bytes(student, spec, budget, candidates, export)  # a budget too small fails first, on every process alike
    saved = staging / PLAN_NAME if staging is not None else None
    shared = accelerator is not None and accelerator.num_processes > 1
    plan = None
    if saved is not None and saved.is_file():
        plan = Plan.load(saved)
        log(f"bit plan read back from the interrupted run ({plan.predicted_bytes / MB:.3f} MB)")
    elif not shared or accelerator.is_main_process:
        sample = calibration_rows(rows, options.calibration_examples, options.seed)
        batches, teacher_out, loss = objective(sample)
        log(f"measuring the sensitivity of each layer group at {', '.join(map(str, candidates))} bits on "
            f"{len(sample)} calibration examples")
        plan = plan_bits(student, spec, budget, candidates, batches, teacher_out, loss, len(sample), export=export)
        for line in plan.table():
            log(line)
    if shared:
        from accelerate.utils import broadcast_object_list

        plan = Plan(**broadcast_object_list([asdict(plan) if plan is not None else None])[0])
    apply_plan(student, plan)
    return spec.with_rules(plan.rules), plan, counts


def plan_metrics(plan: Any, folder: Path, training_seconds: float | None = None) -> dict[str, Any]:
    """What a manifest records of a budget's plan: the budget, the predicted and the written size, the groups' bits,
    and the measurement's time (and its share of the training's)."""
    from modelshrink.quant.model import WEIGHTS_NAME

    written = (Path(folder) / WEIGHTS_NAME).stat().st_size
    out = {"budget_bytes": plan.budget_bytes, "predicted_bytes": plan.predicted_bytes, "written_bytes": written,
           "smallest_bytes": plan.smallest_bytes, "sensitivity_seconds": plan.seconds,
           "calibration_examples": plan.calibration_examples,
           "bits": {name: info["bits"] for name, info in plan.groups.items()}}
    if plan.counted_twice:  # --budget-of export: the size the budget bounds, the export's second copy counted
        out.update(counted_twice=plan.counted_twice, bounded_bytes=plan.bounded_bytes)
    if training_seconds:
        out["sensitivity_share_of_training"] = round(plan.seconds / training_seconds, 4)
    return out


def plan_card(plan: Any) -> list[str]:
    """The plan as a model card section."""
    if plan is None:
        return []
    return ["## Bits by layer group (--budget-mb)", "", "```", *plan.table(), "```", ""]
