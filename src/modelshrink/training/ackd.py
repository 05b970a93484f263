"""ACKD (Guo et al. 2023): adaptive contrastive knowledge distillation for BERT-style classifiers.

    L = α·CE + (1 − α)·KD + β·PT + γ·A-CDL                                      (Eq. 4)

KD is the KL divergence between teacher and student output distributions at temperature T, scaled
by T² (PKD); PT is PKD's patient loss, the MSE between L2-normalized [CLS] hidden states at the
mapped layers; A-CDL is, per mapped layer and averaged over the batch,

    −log POS / (POS + NEG),  POS = exp(cos(zᵢˢ, zᵢᵗ)),  NEG = (1/wᵢ)·Σⱼ exp(cos(zᵢˢ, zⱼᵗ))      (Eq. 3)

with j over the teacher features of samples of another class, from the batch and from the dynamic
feature storage (section 3.5), and wᵢ = sigmoid(P(zᵢˢ)) the predicted discrimination ability of a
small MLP P trained with the student (SAR, section 3.3). Without SAR wᵢ = 1 (plain CDL, Eq. 2).

Three readings the paper leaves open are options whose defaults are the paper's text: the feature z
is the [CLS] vector (`pooling="mean"`: the mean over the sentence's tokens), NEG sums over the
negatives (`negatives="mean"`: their mean), and the cosines enter exp() as they are (a contrastive
temperature τ divides them, MoCo-style; τ = 1 is the paper's).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from modelshrink.errors import UserError

FEATURE_MAPS = ("skip", "last", "copied")
POOLINGS = ("cls", "mean")
NEGATIVE_REDUCTIONS = ("sum", "mean")


# ---------------------------------------------------------------- which layers are compared

def feature_layer_pairs(n_teacher: int, n_student: int, strategy: str = "skip",
                        copied_from: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """(student, teacher) indices into `hidden_states` (0 = embeddings, l = output of layer l) where
    PT and A-CDL compare [CLS] features.

    PKD's strategies leave out the student's last layer, whose knowledge KD already carries:
    skip = every (N/k)-th teacher layer (12→6: 2 4 6 8 10), last = the teacher's last k−1 layers
    before its top. copied = each student layer against the teacher layer it was copied from."""
    if strategy not in FEATURE_MAPS:
        raise UserError(f"--feature-map must be one of {', '.join(FEATURE_MAPS)}, got {strategy}")
    if strategy == "copied":
        if copied_from is None:
            raise UserError("--feature-map copied needs a student copied from the teacher's layers (--layers K)")
        return [(j + 1, int(t) + 1) for j, t in enumerate(copied_from)]
    if n_student > n_teacher:
        raise UserError(f"the student has {n_student} layers, more than the teacher's {n_teacher}")
    if strategy == "skip":
        # j·N/k rounded half up, in integers
        return [(j, (2 * j * n_teacher + n_student) // (2 * n_student)) for j in range(1, n_student)]
    return [(j, n_teacher - n_student + j) for j in range(1, n_student)]


def layer_features(hidden_states: Sequence[torch.Tensor], layers: Sequence[int], pooling: str = "cls",
                   attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """One vector per sentence for each listed layer, [batch, hidden] each: the first token's
    ([CLS] / <s>), or with pooling="mean" the mean over the tokens the attention mask keeps."""
    if pooling not in POOLINGS:
        raise UserError(f"--feature-pooling must be one of {', '.join(POOLINGS)}, got {pooling}")
    if pooling == "cls":
        return [hidden_states[i][:, 0] for i in layers]
    if attention_mask is None:
        return [hidden_states[i].mean(1) for i in layers]
    keep = attention_mask[..., None].to(hidden_states[0].dtype)
    count = keep.sum(1).clamp(min=1)
    return [(hidden_states[i] * keep).sum(1) / count for i in layers]


def feature_spread(hidden_states: Sequence[torch.Tensor], layers: Sequence[int], attention_mask: torch.Tensor
                   ) -> dict[str, dict[int, float]]:
    """Mean cosine between the features of different sentences at each listed layer, for both poolings:
    {"cls": {layer: cos}, "mean": {...}}. Near 1, every sentence has the same feature there, and the patient
    and contrastive terms (uncentred cosines) cannot see which sentences belong together."""
    n = attention_mask.shape[0]
    off = ~torch.eye(n, dtype=torch.bool, device=attention_mask.device)
    spread: dict[str, dict[int, float]] = {}
    for pooling in POOLINGS:
        spread[pooling] = {}
        for layer, z in zip(layers, layer_features(hidden_states, layers, pooling, attention_mask)):
            z = torch.nn.functional.normalize(z.float(), dim=-1)
            spread[pooling][layer] = round(float((z @ z.T)[off].mean()), 4) if n > 1 else 0.0
    return spread


DEGENERATE_COSINE = 0.99  # all-MiniLM-L6-v2's [CLS] at layers 1-4: 1.0000 (REPRODUCTION.md, ACKD)


# ---------------------------------------------------------------- the loss terms

def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher ‖ student) of the softened distributions, × T² so gradients keep their scale.
    A regression head (one output) compares the outputs by MSE instead, as PKD does for STS-B."""
    if student_logits.shape[-1] == 1:
        return F.mse_loss(student_logits.float(), teacher_logits.float())
    t = temperature
    return F.kl_div(F.log_softmax(student_logits.float() / t, -1), F.log_softmax(teacher_logits.float() / t, -1),
                    reduction="batchmean", log_target=True) * t * t


def patient_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor]) -> torch.Tensor:
    """PKD's patient loss: Σₘ MSE(zˢ/‖zˢ‖, zᵗ/‖zᵗ‖) over the mapped layers."""
    return sum(F.mse_loss(F.normalize(s.float(), dim=-1), F.normalize(t.float(), dim=-1))
               for s, t in zip(student, teacher, strict=True))


def contrastive_loss(z_student: torch.Tensor, z_teacher: torch.Tensor, labels: torch.Tensor,
                     bank_features: torch.Tensor | None = None, bank_labels: torch.Tensor | None = None,
                     weights: torch.Tensor | None = None, *, negatives: str = "sum",
                     tau: float = 1.0) -> torch.Tensor:
    """A-CDL of one layer (CDL when `weights` is None), averaged over the batch.

    `z_student`, `z_teacher`: [B, d]; `labels`: [B] class ids; `bank_*`: stored teacher features
    [S, d] and their labels [S]; `weights`: wᵢ in (0, 1], [B]. Negatives of sample i are the teacher
    features, in the batch and the bank, whose label differs from i's; a sample with none scores 0.
    `negatives="mean"` averages NEG over them instead of summing; `tau` divides every cosine."""
    if negatives not in NEGATIVE_REDUCTIONS:
        raise UserError(f"--negatives must be one of {', '.join(NEGATIVE_REDUCTIONS)}, got {negatives}")
    keys, key_labels = z_teacher, labels
    if bank_features is not None and bank_features.shape[0] > 0:
        keys = torch.cat([z_teacher.float(), bank_features.float()])
        key_labels = torch.cat([labels, bank_labels])
    s = F.normalize(z_student.float(), dim=-1)
    sims = s @ F.normalize(keys.float(), dim=-1).T  # cosines [B, B + S]
    pos = sims.diagonal()  # keys start with the batch's own teacher features
    negative = (labels[:, None] != key_labels[None, :]) & (key_labels[None, :] >= 0)  # -1: an empty storage slot
    # NEG / POS = Σⱼ exp((cos_ij − cos_ii)/τ); −log POS/(POS + NEG) = log(1 + NEG/POS)
    ratio = (torch.exp((sims - pos[:, None]) / tau) * negative).sum(-1)
    if negatives == "mean":
        ratio = ratio / negative.sum(-1).clamp(min=1)
    if weights is not None:
        ratio = ratio / weights.float()
    return torch.log1p(ratio).mean()


# ---------------------------------------------------------------- SAR predictor and storage

class DiscriminationPredictor(nn.Module):
    """P in wᵢ = sigmoid(P(zᵢˢ)): an MLP of `depth` linear layers (ReLU between), hidden → 1."""

    def __init__(self, hidden_size: int, depth: int = 2, width: int | None = None):
        super().__init__()
        if depth < 1:
            raise UserError(f"--predictor-layers must be >= 1, got {depth}")
        width = width or hidden_size
        layers: list[nn.Module] = []
        size = hidden_size
        for _ in range(depth - 1):
            layers += [nn.Linear(size, width), nn.ReLU()]
            size = width
        layers.append(nn.Linear(size, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(z.float())).squeeze(-1)


class FeatureStorage(nn.Module):
    """Dynamic feature storage: a FIFO of the newest `size` teacher features per mapped layer and
    their labels. Buffers, so it follows the model's device and is saved in checkpoints (an exact
    resume restores it); never a gradient path."""

    def __init__(self, layers: int, hidden_size: int, size: int = 1000):
        super().__init__()
        if size < 1:
            raise UserError(f"--storage-size must be >= 1, got {size}")
        self.size = size
        self.register_buffer("features", torch.zeros(layers, size, hidden_size))
        self.register_buffer("labels", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))  # samples ever pushed

    def __len__(self) -> int:
        return min(int(self.count), self.size)

    @torch.no_grad()
    def push(self, features: Sequence[torch.Tensor], labels: torch.Tensor) -> None:
        """Append a batch ([B, d] per layer) after the newest entries, dropping the oldest."""
        stacked = torch.stack([f.detach().to(self.features.dtype) for f in features])
        labels = labels.detach()
        if stacked.shape[1] > self.size:
            stacked, labels = stacked[:, -self.size:], labels[-self.size:]
        n = stacked.shape[1]
        slots = (self.count + torch.arange(n, device=self.labels.device)) % self.size  # no read from the device
        self.features[:, slots] = stacked
        self.labels[slots] = labels.to(self.labels.device)
        self.count += n

    def contents(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored features [layers, n, d] and labels [n], oldest first. Under torch.compile, every slot in slot order
        (one shape, nothing read from the device), the empty ones labelled -1, which no loss takes as a negative."""
        if torch.compiler.is_compiling():
            return self.features, self.labels
        n, count = len(self), int(self.count)
        order = (count - n + torch.arange(n, device=self.labels.device)) % self.size
        return self.features[:, order], self.labels[order]


def gather_across_processes(features: Sequence[torch.Tensor], labels: torch.Tensor
                            ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every process's batch features, so that the storages of all processes hold the same samples
    (as MoCo's queue does); batches may differ in size, so they are padded to the largest."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(features), labels
    world = dist.get_world_size()
    size = torch.tensor([labels.shape[0]], device=labels.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    largest = int(max(s.item() for s in sizes))

    def gather(t: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros((largest, *t.shape[1:]), dtype=t.dtype, device=t.device)
        padded[:t.shape[0]] = t
        parts = [torch.zeros_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:int(n.item())] for p, n in zip(parts, sizes)])

    return [gather(f.detach()) for f in features], gather(labels)


# ---------------------------------------------------------------- the objective

class ACKDObjective(nn.Module):
    """The student with what A-CDL trains beside it (one SAR predictor per mapped layer) and the
    feature storage; `forward` returns Eq. 4's loss and its parts.

    The whole loss is computed inside `forward` so that one DDP module holds every trained
    parameter, and the checkpoints of the shared loop hold predictors and storage too. The teacher
    stays outside: it is frozen, and its outputs arrive as inputs."""

    def __init__(self, student: nn.Module, pairs: list[tuple[int, int]], *, alpha: float = 0.5,
                 beta: float = 0.0, gamma: float = 0.0, temperature: float = 1.0, kd: bool = True,
                 pt: bool = True, acdl: bool = True, sar: bool = True, storage_size: int | None = 1000,
                 predictor_layers: int = 2, predictor_width: int | None = None, pooling: str = "cls",
                 negatives: str = "sum", contrast_temperature: float = 1.0):
        super().__init__()
        self.student = student
        self.pairs = list(pairs)
        self.alpha, self.beta, self.gamma, self.temperature = alpha, beta, gamma, temperature
        self.kd, self.pt, self.acdl, self.sar = kd, pt and bool(pairs), acdl and bool(pairs), sar
        self.pooling, self.negatives, self.contrast_temperature = pooling, negatives, contrast_temperature
        hidden = student.config.hidden_size
        self.predictors = nn.ModuleList(
            DiscriminationPredictor(hidden, predictor_layers, predictor_width) for _ in pairs
        ) if self.acdl and sar else None
        self.storage = FeatureStorage(len(pairs), hidden, storage_size) if self.acdl and storage_size else None

    @property
    def needs_teacher(self) -> bool:
        return self.alpha < 1 and self.kd or self.pt or self.acdl

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                contrast_labels: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                teacher_logits: torch.Tensor | None = None,
                teacher_features: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        out = self.student(**inputs, output_hidden_states=self.pt or self.acdl)
        # The student may run under autocast (--precision bf16/fp16); the loss terms are float32.
        with torch.autocast(input_ids.device.type, enabled=False):
            return self._loss(out, attention_mask, labels, contrast_labels, teacher_logits, teacher_features)

    def _loss(self, out: Any, attention_mask: torch.Tensor, labels: torch.Tensor, contrast_labels: torch.Tensor | None,
              teacher_logits: torch.Tensor | None, teacher_features: list[torch.Tensor] | None
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = out.logits.float()
        if logits.shape[-1] == 1:
            task = F.mse_loss(logits.squeeze(-1), labels.float())
        else:
            task = F.cross_entropy(logits, labels)
        total = self.alpha * task
        parts = {"ce": task.detach()}
        if self.kd and self.alpha < 1:
            kd = kd_loss(logits, teacher_logits, self.temperature)
            total = total + (1 - self.alpha) * kd
            parts["kd"] = kd.detach()
        if self.pt or self.acdl:
            z_student = layer_features(out.hidden_states, [s for s, _ in self.pairs], self.pooling, attention_mask)
        if self.pt:
            pt = patient_loss(z_student, teacher_features)
            total = total + self.beta * pt
            parts["pt"] = pt.detach()
        if self.acdl:
            contrast = labels if contrast_labels is None else contrast_labels
            bank, bank_labels = self.storage.contents() if self.storage is not None else (None, None)
            terms, mean_w = [], []
            for m, (zs, zt) in enumerate(zip(z_student, teacher_features)):
                w = self.predictors[m](zs) if self.predictors is not None else None
                terms.append(contrastive_loss(zs, zt, contrast, None if bank is None else bank[m], bank_labels, w,
                                              negatives=self.negatives, tau=self.contrast_temperature))
                if w is not None:
                    mean_w.append(w.detach().mean())
            acd = sum(terms)
            total = total + self.gamma * acd
            parts["acdl"] = acd.detach()
            if mean_w:
                parts["sar_w"] = torch.stack(mean_w).mean()
            if self.storage is not None and self.training:
                self.storage.push(*gather_across_processes(teacher_features, contrast))
        parts["loss"] = total.detach()
        return total, parts
