"""`quantize --budget-mb`: each group's weight bits chosen under a size budget from its measured sensitivity.

Sensitivity, measured rather than estimated: on a calibration sample of the training data, the loss of the
quantized student with every group at the widest candidate (8 bits) is the baseline; then each group alone goes to
each narrower candidate and the loss increase is its sensitivity at those bits. The loss is the task cross-entropy
plus the MSE between the student's and the teacher's logits (the output terms of the distillation loss the run then
trains with). A loss measured this way sees what a second-order (Hessian-trace) estimate cannot at ternary bits,
where a weight moves by a large fraction of itself and the quadratic model no longer holds; it costs one forward
pass of the student per group, narrower width and calibration batch (the teacher's logits are computed once per
batch), which is a few percent of a training run (the plan reports both times). Sensitivities are made monotone
(fewer bits never costs less) and taken as additive across groups.

Allocation: the bits that minimise the summed sensitivity with the predicted weights file within the budget, a
multiple-choice knapsack solved exactly by dynamic programming over the budget in at most `UNITS` steps (each
group's bytes rounded up to a step, so the plan never exceeds the budget). The prediction is the exact size of the
file `save_quantized` writes (its tensors serialized with zero placeholders), so the artifact equals it. Ties go to
fewer bits and the calibration sample is drawn with the run's seed: a plan is deterministic for a seed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from modelshrink.errors import UserError
from modelshrink.quant.groups import quantized_groups, weight_groups, weight_of
from modelshrink.quant.model import predicted_bytes
from modelshrink.quant.packing import packed_bytes
from modelshrink.quant.spec import Group, QuantSpec, Selector

PLAN_NAME = "bit_plan.json"
UNITS = 20_000  # steps of the knapsack over the budget
MB = 1_000_000


class BudgetTooSmall(UserError):
    """A budget below the smallest size the model can be stored at (the message says that size)."""

    def __init__(self, message: str, smallest_bytes: int):
        super().__init__(message)
        self.smallest_bytes = smallest_bytes


@dataclass
class Plan:
    """The bits of every group, why, and the size they make."""

    budget_bytes: int
    predicted_bytes: int
    smallest_bytes: int
    candidates: list[int]
    calibration_examples: int
    baseline_loss: float
    seconds: float
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # name → bits, pinned, parameters, bytes, sensitivity
    # --budget-of export: the groups the export holds in two graphs, counted twice within the budget, and the size
    # that makes (the artifact's is predicted_bytes)
    counted_twice: list[str] = field(default_factory=list)
    bounded_bytes: int | None = None

    @property
    def rules(self) -> tuple[tuple[str, int], ...]:
        """One rule per group: the plan as `--bits` rules, replayed exactly by `QuantSpec.bits_of` (the last rule
        that selects a group wins, so the broader names come first: `other`, the linears outside both stacks such
        as bert2bert's enc_to_dec_proj, also selects `decoder.other`, whose own rule must follow it)."""
        def fields(name: str) -> int:
            selector = Selector.parse(name)
            return sum(part is not None for part in (selector.stack, selector.layer, selector.kind))

        return tuple((name, int(self.groups[name]["bits"])) for name in sorted(self.groups, key=fields))

    def save(self, folder: Path) -> None:
        (Path(folder) / PLAN_NAME).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "Plan":
        return cls(**json.loads(Path(path).read_text()))

    def table(self) -> list[str]:
        """The plan as lines for people: per group its bits, bytes and sensitivity at each narrower width."""
        narrow = [c for c in self.candidates if c != max(self.candidates)]
        twice = (f" (with the export's second copy of {', '.join(self.counted_twice)}: "
                 f"{self.bounded_bytes / MB:.3f} MB)" if self.counted_twice and self.bounded_bytes else "")
        lines = [f"bit plan: {self.predicted_bytes / MB:.3f} MB{twice} of a {self.budget_bytes / MB:.3f} MB budget "
                 f"(smallest possible {self.smallest_bytes / MB:.3f} MB); sensitivity = loss increase at "
                 + "/".join(f"{c}" for c in narrow) + f" bits over {self.calibration_examples} calibration examples "
                 f"(baseline loss {self.baseline_loss:.4f}, {self.seconds:.1f} s)",
                 f"  {'group':<28} {'bits':>4} {'params':>10} {'bytes':>10}  sensitivity   (bytes: the packed codes; "
                 "scales, float tensors and the file's header make the rest of the size)"]
        for name, info in self.groups.items():
            sens = "pinned" if info["pinned"] else " ".join(f"{info['sensitivity'][str(c)]:+.4f}" for c in narrow)
            lines.append(f"  {name:<28} {info['bits']:>4} {info['parameters']:>10,} {info['bytes']:>10,}  {sens}")
        return lines


def _set_bits(modules: list[tuple[str, nn.Module]], bits: int) -> None:
    for _, module in modules:
        module.parametrizations.weight[0].bits = bits


def _tensors(modules: list[tuple[str, nn.Module]]) -> list[torch.Tensor]:
    unique: dict[int, torch.Tensor] = {}
    for _, module in modules:
        unique.setdefault(id(weight_of(module)), weight_of(module))
    return list(unique.values())


def group_bytes(modules: list[tuple[str, nn.Module]], bits: int) -> int:
    """The packed codes of a group's tensors at `bits` (scales do not depend on the bits)."""
    return sum(packed_bytes(t.numel(), bits) for t in _tensors(modules))


def copy_bytes(modules: list[tuple[str, nn.Module]], bits: int) -> int:
    """A second copy of a table group: its packed codes at `bits` and its float32 scales, one a row."""
    return group_bytes(modules, bits) + sum(4 * t.shape[0] for t in _tensors(modules))


def stored_twice(model: nn.Module, groups: dict[Group, list]) -> dict[Group, list]:
    """The groups an ONNX export holds in two graphs: a word-embedding table the encoder and the decoder share (one
    group, `embeddings`, in an encoder-decoder model) is in the encoder's graph and in the decoder's."""
    if not getattr(model.config, "is_encoder_decoder", False):
        return {}
    return {g: m for g, m in groups.items() if g.kind == "embeddings" and not g.stack}


def _bits_now(modules: list[tuple[str, nn.Module]]) -> int:
    return modules[0][1].parametrizations.weight[0].bits


def bounded_size(model: nn.Module, twice: dict[Group, list]) -> int:
    """What a budget bounds: the artifact's predicted bytes, and the second copy of each `twice` group."""
    return predicted_bytes(model) + sum(copy_bytes(m, _bits_now(m)) for m in twice.values())


@torch.no_grad()
def measure(model: nn.Module, free: dict[Group, list], candidates: tuple[int, ...], batches: list[Any],
            teacher_out: Callable[[Any], Any], loss: Callable[[nn.Module, Any, Any], torch.Tensor],
            progress: Callable[[int, int], None] = lambda done, total: None) -> tuple[float, dict[Group, dict[int, float]]]:
    """(baseline loss, sensitivity[group][bits]) over the batches; every free group is at max(candidates) after."""
    top = max(candidates)
    settings: list[tuple[Group | None, int]] = [(None, top)] + [(g, c) for g in free for c in candidates if c != top]
    totals = [0.0] * len(settings)
    was_training = model.training
    model.eval()
    for group in free.values():
        _set_bits(group, top)
    for i, batch in enumerate(batches):
        target = teacher_out(batch)
        for k, (group, bits) in enumerate(settings):
            if group is not None:
                _set_bits(free[group], bits)
            totals[k] += float(loss(model, batch, target))
            if group is not None:
                _set_bits(free[group], top)
        progress(i + 1, len(batches))
    model.train(was_training)
    baseline = totals[0] / max(len(batches), 1)
    sensitivity: dict[Group, dict[int, float]] = {g: {top: 0.0} for g in free}
    for (group, bits), total in zip(settings[1:], totals[1:]):
        sensitivity[group][bits] = total / max(len(batches), 1) - baseline
    for per_bits in sensitivity.values():  # fewer bits never cost less: the running maximum from wide to narrow
        worst = 0.0
        for bits in sorted(per_bits, reverse=True):
            worst = per_bits[bits] = max(per_bits[bits], worst)
    return baseline, sensitivity


def allocate(extra: dict[Group, dict[int, int]], sensitivity: dict[Group, dict[int, float]],
             capacity: int) -> dict[Group, int]:
    """Bits per group minimising summed sensitivity with summed extra bytes (over each group's narrowest) within
    `capacity`: a multiple-choice knapsack, exact over the capacity in steps of ceil(capacity / UNITS) bytes."""
    groups = list(extra)
    step = max(1, math.ceil(capacity / UNITS))
    size = capacity // step
    best = np.zeros(size + 1)
    picks = []
    for group in groups:
        options = sorted(extra[group])
        new = np.full(size + 1, np.inf)
        pick = np.zeros(size + 1, dtype=np.int8)
        for index, bits in enumerate(options):
            units = math.ceil(extra[group][bits] / step)
            if units > size:
                continue
            value = best[:size + 1 - units] + sensitivity[group][bits]
            better = value < new[units:]
            new[units:][better] = value[better]
            pick[units:][better] = index
        best = new
        picks.append((group, options, pick))
    chosen: dict[Group, int] = {}
    left = size
    for group, options, pick in reversed(picks):
        bits = options[int(pick[left])]
        chosen[group] = bits
        left -= math.ceil(extra[group][bits] / step)
    return chosen


def _free_groups(model: nn.Module, spec: QuantSpec) -> tuple[dict[Group, list], set[Group]]:
    """(the groups the budget chooses bits for, those a rule pins); position tables are quantized only when pinned."""
    groups = quantized_groups(model, spec)
    pinned = {g for g in groups if any(Selector.parse(s).matches(g) for s, _ in spec.rules)}
    return {g: m for g, m in groups.items() if g not in pinned}, pinned


def smallest_bytes(model: nn.Module, spec: QuantSpec, budget_bytes: int, candidates: tuple[int, ...],
                   export: bool = False) -> int:
    """The size with every group not pinned by a rule at the narrowest candidate, which the model is left at (with
    `export`, a second copy of each group the export stores twice counted in); a UserError, saying that size, where
    the budget is below it."""
    free, pinned = _free_groups(model, spec)
    twice = stored_twice(model, quantized_groups(model, spec)) if export else {}
    if not free:
        raise UserError(f"--bits {spec.label} pins every weight group, so --budget-mb has nothing to choose: drop "
                        f"--budget-mb (the pins alone store {predicted_bytes(model) / MB:.3f} MB) or pin fewer groups")
    low = min(candidates)
    for group in free.values():
        _set_bits(group, low)
    smallest = bounded_size(model, twice)
    if smallest > budget_bytes:
        pins = f" and {len(pinned)} pinned group(s) at their --bits" if pinned else ""
        raise BudgetTooSmall(f"--budget-mb {budget_bytes / MB:g} is below the smallest this model can be stored: "
                             f"{smallest / MB:.3f} MB, every weight at {low} bits{pins}"
                             + (" (and the export's second copy of the shared word-embedding table)" if twice else "")
                             + "; raise the budget, or shrink the model too (--encoder-layers/--decoder-layers)",
                             smallest)
    return smallest


def plan_bits(model: nn.Module, spec: QuantSpec, budget_bytes: int, candidates: tuple[int, ...], batches: list[Any],
              teacher_out: Callable[[Any], Any], loss: Callable[[nn.Module, Any, Any], torch.Tensor],
              calibration_examples: int, progress: Callable[[int, int], None] = lambda done, total: None,
              export: bool = False) -> Plan:
    """Measure, allocate and set the bits of a model quantized under `spec` (W = E = 8, rules pin groups); the
    model's weights are at the plan's bits after. A UserError where the budget cannot be met."""
    groups = quantized_groups(model, spec)
    free, pinned = _free_groups(model, spec)
    low = min(candidates)
    smallest = smallest_bytes(model, spec, budget_bytes, candidates, export)
    twice = stored_twice(model, groups) if export else {}
    start = time.perf_counter()
    baseline, sensitivity = measure(model, free, candidates, batches, teacher_out, loss, progress)
    seconds = time.perf_counter() - start
    extra = {g: {c: (group_bytes(m, c) - group_bytes(m, low)) * (2 if g in twice else 1) for c in candidates}
             for g, m in free.items()}
    # the file's header (tensor names, shapes, offsets) grows by a few digits with the data: allocate under the
    # budget less a slack, and where the header grew by more, again under that much less (at a capacity of 0
    # every free group is at the narrowest bits: the smallest size, which is within the budget)
    slack = 64
    while True:
        capacity = max(0, budget_bytes - smallest - slack)
        chosen = allocate(extra, sensitivity, capacity)
        for group, bits in chosen.items():
            _set_bits(free[group], bits)
        bounded = bounded_size(model, twice)
        if bounded <= budget_bytes or capacity == 0:
            break
        slack += bounded - budget_bytes
    predicted = predicted_bytes(model)
    infos = {}
    for group, modules in groups.items():
        bits = chosen.get(group, spec.bits_of(group))
        infos[group.name] = {"bits": bits, "pinned": group in pinned,
                             "parameters": sum(t.numel() for t in _tensors(modules)),
                             "bytes": group_bytes(modules, bits),
                             "sensitivity": {} if group in pinned else
                             {str(c): round(v, 6) for c, v in sorted(sensitivity[group].items())}}
    return Plan(budget_bytes, predicted, smallest, list(candidates), calibration_examples, round(baseline, 6),
                round(seconds, 3), infos, [g.name for g in twice], bounded if twice else None)


def apply_plan(model: nn.Module, plan: Plan) -> None:
    """Set a quantized model's bits to a saved plan's (a resumed run); a UserError if the plan is for another model.
    Each of the plan's groups sets the model's group of that name; a plan made when a bert2bert's two word-embedding
    tables were one `embeddings` group sets both with it."""
    groups = {g: m for g, m in weight_groups(model).items()  # those quantized: position tables only if pinned
              if all(parametrize.is_parametrized(module, "weight") for _, module in m)}
    chosen: dict[Group, int] = {}
    for name, info in plan.groups.items():
        selected = [g for g in groups if g.name == name or (name == "embeddings" and g.kind == "embeddings")]
        if not selected or any(g in chosen for g in selected):
            chosen = {}
            break
        chosen.update({g: int(info["bits"]) for g in selected})
    if set(chosen) != set(groups):
        raise UserError(f"{PLAN_NAME} in the run's folder is for another model (its groups differ); start the run "
                        "again without --resume")
    for group, bits in chosen.items():
        _set_bits(groups[group], bits)


def calibration_rows(rows: list[Any], count: int, seed: int) -> list[Any]:
    """`count` rows drawn with the run's seed (all of them when there are fewer), in their original order."""
    if count >= len(rows):
        return list(rows)
    picked = sorted(np.random.default_rng(seed).choice(len(rows), size=count, replace=False).tolist())
    return [rows[i] for i in picked]


def batched(items: list[Any], size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
