"""python recipes/ackd_terms.py [TEACHER] [STUDENT] [--data DIR] [--batches N]

ACKD follow-up: how much each term of Eq. 4 pulls on the student. For N batches of 32 training
sentences it computes CE, KD, PT and A-CDL (negatives from the batch and a storage of 1,000 other
training sentences' teacher features, as in training) and the gradient norm each weighted term
puts on the student's weights, for the paper's loss as modelshrink implements it and for the
readings and scales the paper leaves open:
  - PT and A-CDL on the mean of the tokens instead of [CLS];
  - Eq. 2's NEG as the mean over negatives instead of the sum;
  - a contrastive temperature τ = 0.1 (the paper has none, i.e. τ = 1);
  - β and γ 10-100× above the paper's grid.
It also prints the cosines the contrastive term sees, and dL/dw of A-CDL (SAR), which is negative
for every sample: minimising the loss pushes every wᵢ toward 1.

STUDENT: a trained student artifact, or "copy" (default) for the 3-layer student as training
starts (teacher layers 0, 3, 5). Defaults: runs/repro/ackd/teacher, ../shared/data/rt-polarity.
Nothing is trained; about a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from modelshrink.training import classify
from modelshrink.training.ackd import contrastive_loss, feature_layer_pairs, kd_loss, layer_features, patient_loss
from modelshrink.models.loading import load_classifier
from modelshrink.models.shrink import shrink_encoder, spaced_layer_ids


def grad_norm(loss, params):
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher", nargs="?", default="runs/repro/ackd/teacher")
    parser.add_argument("student", nargs="?", default="copy")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/rt-polarity"))
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--layers", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    teacher, tokenizer = load_classifier(args.teacher, "teacher")
    teacher.eval()
    n_teacher = teacher.config.num_hidden_layers
    if args.student == "copy":
        student = shrink_encoder(teacher, spaced_layer_ids(n_teacher, args.layers))
    else:
        student, _ = load_classifier(args.student, "student")
    student.eval()  # no dropout: the same forward for every variant
    pairs = feature_layer_pairs(n_teacher, student.config.num_hidden_layers, "skip")
    params = [p for p in student.parameters() if p.requires_grad]
    rows = classify.read_labeled(str(args.data / "train.jsonl"))
    random.Random(0).shuffle(rows)
    bank_rows, rows = rows[:1000], rows[1000:1000 + 32 * args.batches]
    collate = classify.make_collate(tokenizer.pad_token_id)

    def batch(part):
        return collate(classify.tokenize_labeled(part, tokenizer, 128))

    def inputs(b):
        return {k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in b}

    banks = {}
    with torch.no_grad():
        for pooling in ("cls", "mean"):
            feats, labels = [[] for _ in pairs], []
            for i in range(0, 1000, 100):
                b = batch(bank_rows[i:i + 100])
                out = teacher(**inputs(b), output_hidden_states=True)
                for m, f in enumerate(layer_features(out.hidden_states, [t for _, t in pairs], pooling,
                                                                    b["attention_mask"])):
                    feats[m].append(f)
                labels.append(b["labels"])
            banks[pooling] = ([torch.cat(f) for f in feats], torch.cat(labels))

    stats: dict[str, list[float]] = {}

    def note(key, value):
        stats.setdefault(key, []).append(float(value.detach() if torch.is_tensor(value) else value))

    alpha, beta, gamma, temperature = 0.5, 20.0, 5e-3, 5.0
    for k in range(args.batches):
        b = batch(rows[32 * k:32 * (k + 1)])
        with torch.no_grad():
            t = teacher(**inputs(b), output_hidden_states=True)
        out = student(**inputs(b), output_hidden_states=True)
        labels = b["labels"]
        ce = F.cross_entropy(out.logits, labels)
        kd = kd_loss(out.logits, t.logits, temperature)
        note("CE: α·CE", alpha * ce), note("CE: grad", grad_norm(alpha * ce, params))
        note("KD: (1−α)·KD", (1 - alpha) * kd), note("KD: grad", grad_norm((1 - alpha) * kd, params))
        for pooling in ("cls", "mean"):
            zs = layer_features(out.hidden_states, [s for s, _ in pairs], pooling, b["attention_mask"])
            zt = layer_features(t.hidden_states, [t_ for _, t_ in pairs], pooling, b["attention_mask"])
            bank, bank_labels = banks[pooling]
            pt = patient_loss(zs, zt)
            note(f"PT [{pooling}] β=20: β·PT", beta * pt)
            note(f"PT [{pooling}] β=20: grad", grad_norm(beta * pt, params))
            note(f"PT [{pooling}] β=2000: grad", grad_norm(100 * beta * pt, params))
            for reduce, tau in (("sum", 1.0), ("mean", 1.0), ("sum", 0.1)):
                cdl = sum(contrastive_loss(s, t_, labels, bk, bank_labels, negatives=reduce, tau=tau)
                          for s, t_, bk in zip(zs, zt, bank))
                name = f"CDL [{pooling}, NEG {reduce}, τ={tau:g}]"
                note(f"{name} γ=5e-3: γ·CDL", gamma * cdl)
                note(f"{name} γ=5e-3: grad", grad_norm(gamma * cdl, params))
                note(f"{name} γ=0.5: grad", grad_norm(100 * gamma * cdl, params))
            keys, key_labels = torch.cat([zt[0], bank[0]]), torch.cat([labels, bank_labels])
            sims = F.normalize(zs[0], dim=-1) @ F.normalize(keys, dim=-1).T
            note(f"cos(student, own teacher feature) [{pooling}], first mapped layer", sims.diagonal().mean())
            note(f"cos(student, teacher features of the other class) [{pooling}], first mapped layer",
                 sims[labels[:, None] != key_labels[None, :]].mean())
            if pooling == "cls":
                w = torch.full((labels.shape[0],), 0.5, requires_grad=True)
                loss = contrastive_loss(zs[0], zt[0], labels, bank[0], bank_labels, w)
                (dw,) = torch.autograd.grad(loss, w)
                note("SAR: share of samples with dL/dwᵢ < 0 at w = 0.5", (dw < 0).float().mean())

    print(f"Student: {args.student} ({student.config.num_hidden_layers} layers); feature pairs (student, teacher) "
          f"{pairs}; {args.batches} batches of 32 training sentences; storage: 1,000 other training sentences. "
          f"α = {alpha}, T = {temperature}.\n")
    print("| quantity | mean over batches | ratio of gradient norms to CE's |")
    print("|---|---|---|")
    ce_grad = statistics.mean(stats["CE: grad"])
    for key, values in stats.items():
        ratio = f"{statistics.mean(values) / ce_grad:.3g}" if key.endswith("grad") else ""
        print(f"| {key} | {statistics.mean(values):.4g} | {ratio} |")


if __name__ == "__main__":
    main()
