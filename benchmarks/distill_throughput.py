"""Training throughput of `distill` against Hugging Face's `Seq2SeqTrainer`, side by side in one run,
and what the word-level distillation losses cost.

    python benchmarks/distill_throughput.py               # 20 timed steps × 2 rounds
    python benchmarks/distill_throughput.py --steps 8 --rounds 1 --no-write   # a quick look

Model: the bert2bert warm-started from the packaged MiniLM-L6 (6 + 6 layers), shrunk by `distill`
to a 6-3 student (decoder layers 0, 3, 5); the same student, data (the bundled Debian sample), batch
size, sequence limits, optimizer (AdamW, lr 1e-4, clipping 1.0) and label smoothing (0.1) in every
setting. Settings:

  * modelshrink distill, cross-entropy only (sequence-level distillation, what PLATE trains);
  * transformers Seq2SeqTrainer on the same student and batches;
  * modelshrink distill with logits (MSE) + hidden + attention losses against the 6-6 teacher
    (DQ-BART), which adds a teacher forward pass and eager attention;
  * modelshrink quantize 2-2-8, distillation-aware: the student teaching its own ternary copy, and
    modelshrink distill with quantize's losses (cross-entropy without smoothing + MSE on logits, hidden
    states and attention), the float student teaching itself: what fake quantization costs, the
    CPU side of issue 54's target (quantize >= 0.85x the tokens/s of distill with the same KD losses).

    python benchmarks/distill_throughput.py --only quantize --no-write   # the last two settings

Throughput is non-padding source + target tokens per second over the timed steps, after
--warmup untimed steps; settings are interleaved for --rounds rounds and the median is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _report import cpu, publish

DISTILL_SAME_KD = "modelshrink distill, quantize's losses, the student teaching itself"
QUANTIZE = "modelshrink quantize 2-2-8, distillation-aware"


def modelshrink_run(student: Path, teacher: Path, data: Path, work: Path, args, kd: bool) -> float:
    from modelshrink.steps.distill import DistillOptions, distill

    extra = dict(teacher=str(teacher), kd_logits="mse", kd_hidden=1.0, kd_attention=1.0,
                 encoder_layers=6, decoder_layers=3) if kd else dict(student=str(student))
    options = DistillOptions(data=str(data), max_steps=args.warmup + args.steps, batch_size=args.batch_size,
                             max_source_length=args.source, max_target_length=args.target, lr=1e-4,
                             log_every=1, device="cpu", seed=0, **extra)
    return timed_rate(distill(options, work, overwrite=True), args)


def quantize_pair_run(student: Path, data: Path, work: Path, args, quantized: bool) -> float:
    """quantize 2-2-8 (distillation-aware) of the student, or distill with its losses, the student teaching itself."""
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    common = dict(data=str(data), max_steps=args.warmup + args.steps, batch_size=args.batch_size,
                  max_source_length=args.source, max_target_length=args.target, lr=1e-4, log_every=1, device="cpu",
                  seed=0)
    if quantized:
        out = quantize(QuantizeOptions(model=str(student), bits="2-2-8", method="distill", **common), work,
                       overwrite=True)
    else:  # options/quantize.py's losses, as distill options
        out = distill(DistillOptions(teacher=str(student), student=str(student), kd_logits="mse", kd_hidden=1.0,
                                     kd_attention=1.0, label_smoothing=0.0, **common), work, overwrite=True)
    return timed_rate(out, args)


def timed_rate(out: Path, args) -> float:
    """Non-padding tokens a second over the steps after the warm-up, from a run's train_log.jsonl."""
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    timed = [e for e in log if e.get("step", 0) > args.warmup and "tokens" in e]
    return sum(e["tokens"] for e in timed) / sum(e["seconds"] for e in timed)


def hf_run(student: Path, data: Path, work: Path, args) -> float:
    from transformers import (AutoTokenizer, DataCollatorForSeq2Seq, EncoderDecoderModel, Seq2SeqTrainer,
                              Seq2SeqTrainingArguments, TrainerCallback)

    tokenizer = AutoTokenizer.from_pretrained(student)
    model = EncoderDecoderModel.from_pretrained(student)
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    sources = tokenizer([r["document"] for r in rows], truncation=True, max_length=args.source)["input_ids"]
    targets = tokenizer(text_target=[r["summary"] for r in rows], truncation=True, max_length=args.target)["input_ids"]
    dataset = [{"input_ids": s, "attention_mask": [1] * len(s), "labels": t} for s, t in zip(sources, targets)]
    base = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    tokens: list[int] = []

    def collate(features):
        batch = base(features)
        tokens.append(int(batch["attention_mask"].sum()) + int((batch["labels"] != -100).sum()))
        return batch

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

        def on_step_begin(self, *a, **k):
            if not stamps:
                stamps.append(time.perf_counter())

    training = Seq2SeqTrainingArguments(
        output_dir=str(work), per_device_train_batch_size=args.batch_size, max_steps=args.warmup + args.steps,
        learning_rate=1e-4, weight_decay=0.01, max_grad_norm=1.0, label_smoothing_factor=0.1, lr_scheduler_type="linear",
        logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0,
        disable_tqdm=True)
    trainer = Seq2SeqTrainer(model=model, args=training, train_dataset=dataset, data_collator=collate,
                             callbacks=[Clock()])
    trainer.train()
    # stamps[0] is the start; stamps[i] the end of step i. Time and tokens of steps after the warm-up.
    seconds = stamps[-1] - stamps[args.warmup]
    return sum(tokens[args.warmup:args.warmup + args.steps]) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--source", type=int, default=96)
    parser.add_argument("--target", type=int, default=24)
    parser.add_argument("--only", choices=("all", "distill", "quantize"), default="all",
                        help="distill: the first three settings; quantize: the last two (with --no-write)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.only != "all" and not args.no_write:
        parser.error("--only makes part of the table: add --no-write")

    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.quickstart import sample_path, warmstart_artifact
    from modelshrink.models.warmstart import packaged_minilm

    work = Path(tempfile.mkdtemp(prefix="bench-distill-"))
    teacher = warmstart_artifact(packaged_minilm(), work / "teacher")
    student = distill(DistillOptions(data=str(sample_path()), teacher=str(teacher), decoder_layers=3, max_steps=0),
                      work / "student")
    data = sample_path()
    settings = {
        "modelshrink distill (cross-entropy)": lambda r: modelshrink_run(student, teacher, data, work / f"ms-{r}",
                                                                         args, kd=False),
        "transformers Seq2SeqTrainer": lambda r: hf_run(student, data, work / f"hf-{r}", args),
        "modelshrink distill + logits, hidden, attention losses": lambda r: modelshrink_run(
            student, teacher, data, work / f"kd-{r}", args, kd=True),
        DISTILL_SAME_KD: lambda r: quantize_pair_run(student, data, work / f"self-{r}", args, quantized=False),
        QUANTIZE: lambda r: quantize_pair_run(student, data, work / f"quantize-{r}", args, quantized=True),
    }
    keep = {"all": list(settings), "distill": list(settings)[:3], "quantize": [DISTILL_SAME_KD, QUANTIZE]}[args.only]
    settings = {name: settings[name] for name in keep}
    rates: dict[str, list[float]] = {name: [] for name in settings}
    names = list(settings)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rates[name].append(settings[name](r))
            print(f"round {r + 1} {name}: {rates[name][-1]:.1f} tokens/s", file=sys.stderr)
    medians = {name: statistics.median(v) for name, v in rates.items()}
    if args.only != "all":
        print(json.dumps(medians, indent=1))
        return
    hf = medians["transformers Seq2SeqTrainer"]
    ce = medians["modelshrink distill (cross-entropy)"]
    lines = [
        f"Student: bert2bert from MiniLM-L6, 6 encoder + 3 decoder layers (from a 6-6 warm start); bundled Debian "
        f"sample, batch {args.batch_size}, sources ≤ {args.source} tokens, summaries ≤ {args.target}; {args.steps} "
        f"timed steps after {args.warmup} untimed, {args.rounds} interleaved rounds, median. Machine: "
        f"{cpu()}, {torch.get_num_threads()} threads, torch {torch.__version__}. Command: "
        f"`python benchmarks/distill_throughput.py` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| setting | tokens/s (median) | vs Seq2SeqTrainer | vs distill CE | every round |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        lines.append(f"| {name} | {medians[name]:.1f} | {medians[name] / hf:.3f}× | {medians[name] / ce:.3f}× | "
                     f"{', '.join(f'{x:.1f}' for x in rates[name])} |")
    quantized = medians[QUANTIZE] / medians[DISTILL_SAME_KD]
    lines += ["", f"quantize 2-2-8 against distill with the same losses (the same student teaching itself): "
              f"{quantized:.3f}× (issue 54's target on a GPU: ≥ 0.85×)."]
    text = "\n".join(lines)
    publish("distill_throughput", "distill: training throughput against Seq2SeqTrainer", text, write=not args.no_write)


if __name__ == "__main__":
    main()
