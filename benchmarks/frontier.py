"""What the whole chain buys: every deployable form of one teacher, side by side (issues 29 and 55).

    python benchmarks/frontier.py --teacher runs/repro/teacher --reuse runs/repro/dq-bart   # hours on 2 cores
    python benchmarks/frontier.py --tiny --no-write --work /tmp/frontier                     # a smoke run (minutes)
    python benchmarks/frontier.py --task translation --teacher runs/repro-mt/teacher --reuse runs/repro-mt/dq-bart
    python benchmarks/frontier.py --task translation --tiny --no-write --work /tmp/frontier-mt   # its smoke run

From a teacher and the Debian data (--data: train.jsonl.gz and validation.jsonl.gz) it makes, or reuses, every
deployable form the chain gives; each artifact is resumable (a rerun continues an interrupted one and keeps a
finished one):
  teacher                   PyTorch eager, and `export` float32
  student                   `distill --teacher --decoder-layers D` on the gold pairs, `--trim-vocab` for
                            summarization (--no-trim-vocab: the teacher's whole vocabulary; --student to reuse one),
                            exported float32, --int8 and --int4
  8-8-8, 2-2-8 (all layers) distillation-aware `quantize` of the teacher, exported (kernels measured by export);
  2-2-8, fewer layers       the same with D decoder layers; --reuse DIR takes them from recipes/dq-bart-debian.sh's
                            folder (888-6-6, 228-6-6, 228-6-3) instead of training them
  --uniform (2-8-8, 4-4-8,  more uniform bits, all layers, the same steps (issue 55; translation: 4-4-8, 3-3-8)
   3-3-8)
  --budgets (10x, 13x,      `quantize --budget-mb`: each layer group's bits chosen from measured sensitivity under a
   10x:D, =2-2-8:D,         budget (MB, or Nx: the teacher's float32 weights over N; `:D` with D decoder layers, as
   10x:student, =2-8-8,     the fewer-layer 2-2-8, which is what a 5x batch-1 speed-up needs), the same steps. The
   =4-4-8)
                            budget bounds the export, what is deployed and measured (--budget-of export):
                            `quantize --budget-of export`'s budget is it less the graph the export adds, measured
                            on the uniform 2-2-8 export of the same depth and on an untrained 4-4-8 one (the larger:
                            4-bit kernels add other constants; export MB less its artifact's, 0.46 MB at MiniLM's
                            size, and less the second copy of a table the encoder and decoder share, which
                            quantize counts itself at the bits it gives it; a tiny model is mostly graph:
                            --budget-of artifact bounds the artifact alone); each is
                            also compared with the uniform form of its depth nearest its size (paired permutation
                            test, `eval --compare`). `=W-E-A` (=4-4-8) is a budget of that uniform form's
                            artifact size, byte for byte, made after it and compared with it: the allocation
                            against uniform bits at an equal budget (`=2-2-8:D`: the fewer-layer 2-2-8's). Every
                            budget form is quantized with --budget-bits (8-8-8,positions=8: the learned position
                            tables pinned at 8 bits, every other group's bits chosen; translation: 8-8-8, its
                            positions are sinusoids, not stored), but for the equal budget of a uniform form
                            wider than 2-2-8 (=2-8-8, =4-4-8), whose position tables stay float as that form's do:
                            the two then differ only in how the same bytes are allocated. `:student` quantizes the
                            distilled student instead of the
                            teacher (the whole chain: distill, then quantize under the budget, the teacher teaching
                            both); it has had the student's steps besides, so it is left out of that comparison
Every quantize form scales its weights per output row (--granularity row; `tensor` is DQ-BART's setting): the
MiniLM teacher's weights have outliers (an FFN output matrix's largest |w| is 175 times its RMS), and one scale a
tensor rounds them at 4 bits with a relative error of 0.81-0.97, worse than ternary's 0.47, at 8 bits up to 0.40;
per row 0.14-0.20 and 0.008-0.022.
Then each form, on the first --docs validation documents (beam 4, no repeated trigram, sources <= 128 tokens,
summaries <= 32): ROUGE-1/2/L with 95% intervals and a paired permutation test against the teacher (`eval`,
resumable), and ROUGE-L against the PyTorch model each export was made from (is it in that model's interval?),
MB on disk (weight files), peak RSS of a fresh process that loads the form and summarizes 16 documents at batch 16, batch-1 p50/p90 over --latency-docs documents (the forms taking turns, so a change of
load hits all alike, each finding the caches full of the others' weights), batch-1 p50 of each form alone on them
(as a process serving that model runs; --rounds rounds) and batch-16 docs/s (median of --rounds passes over
--throughput-docs documents). A speed target counts as met when both batch-1 measures meet it. At batch 1 each
export runs on the onnxruntime threads it is fastest on, one or every core, timed alone on 4 documents each way
first (frontier.json's batch1_threads); PyTorch forms and batch 16 run on every core.
Each form is scored as soon as it is made (before the next is trained) and its scores recorded in --work's
progress.json, so that a run of many hours gives each number as it has it. It writes frontier.json into --work,
the figure (--figure: ROUGE-L against batch-1 latency, marker area = MB) and the table into BENCHMARKS.md
(section frontier) unless --no-write.
Targets: one compressed form >= 4x smaller and >= 3x faster (batch 1) than the teacher in PyTorch, ROUGE-L within
1.0 point of the teacher's (issue 29); one >= 10x smaller and >= 5x faster within 1.0 (issue 55).

--task translation does the same for DQ-BART Table 2's translation teacher (recipes/dq-bart-translation.sh, a
Marian-shaped 6+6 trained from scratch; --teacher runs/repro-mt/teacher) on the Debian translations (--data
../shared/data/debian-translations, --pair en-de: en-de.train.jsonl.gz, en-de.validation.jsonl.gz), with that
recipe's search (beam 4, translations and sources <= 128 tokens) and quantize budget (600 steps of 4,096 tokens,
fewer decoder layers 1,200): sacreBLEU's BLEU with its 95% interval and chrF beside it, as `eval` scores a
translation, the paired test against the teacher and each budget form's against its uniform form on BLEU, the
verdicts within 1.0 BLEU (issue 55). Its artifacts go to --work runs/frontier-translation, its table between
BENCHMARKS.md's frontier-translation markers and its figure to benchmarks/frontier-translation.png; --tiny trains a
small Marian for a few steps on pairs made from the bundled sample. What differs between the tasks is one row each
in benchmarks/_frontier_tasks.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _frontier_tasks import TASKS, Task
from _report import cpu, publish

TEACHER = "teacher, PyTorch"
TOLERANCE = 1.0  # the verdicts' bar: within this many points (ROUGE-L or BLEU) of the teacher


def weight_mb(kind: str, path: Path) -> float:
    pattern = "*.onnx" if kind == "onnx" else "*.safetensors"
    return sum(p.stat().st_size for p in path.glob(pattern)) / 1e6


def summarizer(kind: str, path: Path, task: Task, threads: int | None = None):
    """documents, batch size -> summaries (or translations), for a PyTorch model folder or an export folder (on
    `threads` onnxruntime threads; every core by default)."""
    if kind == "onnx":
        from modelshrink.runtime import load

        runtime = load(path, threads=threads or len(os.sched_getaffinity(0)))
        return lambda docs, batch: runtime.summarize(docs, batch, task.max_source, **task.generation)
    import torch

    from modelshrink.generation.settings import decode, generate_ids, resolve_generation
    from modelshrink.models.loading import load_seq2seq

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model, tokenizer, _ = load_seq2seq(str(path))
    settings = resolve_generation(model.generation_config, **task.generation)

    def run(docs: list[str], batch: int) -> list[str]:
        out = []
        for start in range(0, len(docs), batch):
            enc = tokenizer(docs[start:start + batch], truncation=True, max_length=task.max_source, padding=True,
                            return_tensors="pt")
            out += decode(tokenizer, generate_ids(model, enc["input_ids"], enc["attention_mask"], settings))
        return out

    return run


def peak_rss_mb(kind: str, path: Path, docs: list[str], task: Task) -> float:
    """Peak resident memory of a fresh process that loads the form and summarizes `docs` at batch 16."""
    result = subprocess.run([sys.executable, __file__, "--task", task.name, "--rss-of", kind, str(path)],
                            input=json.dumps(docs), capture_output=True, text=True, timeout=3600)
    if result.returncode:
        raise RuntimeError(f"peak RSS of {path}: {result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def read_rows(path: Path, limit: int) -> list[dict]:
    from modelshrink.data import open_data

    rows = []
    for row in open_data(str(path)).rows():
        rows.append(row)
        if len(rows) == limit:
            break
    return rows


def training_budget(args: argparse.Namespace) -> dict:
    """What every training run of the frontier shares: the task's lengths, --max-tokens, the seed."""
    task = TASKS[args.task]
    return dict(max_source_length=task.max_source, max_target_length=task.max_target, max_tokens=args.max_tokens,
                seed=0)


def make_student(args: argparse.Namespace, train: Path, fewer: int, log) -> Path:
    """`distill --teacher --decoder-layers FEWER` on the gold pairs (resumed, or kept when finished)."""
    from modelshrink.steps.distill import DistillOptions, distill

    student = args.work / f"student-{fewer}"
    log(f"student with {fewer} decoder layers ({args.student_steps} steps"
        + (", the training data's tokens only)" if args.trim_vocab else ")"))
    distill(DistillOptions(data=str(train), teacher=str(Path(args.teacher)), decoder_layers=fewer,
                           trim_vocab=args.trim_vocab,
                           max_steps=args.student_steps, lr=TASKS[args.task].student_lr, warmup_ratio=0.05,
                           save_every=100, **training_budget(args)), student, resume=True, log=log)
    return student


def make_quantized(args: argparse.Namespace, train: Path, fewer: int, uniform: list[tuple], log):
    """The distillation-aware quantize forms (taken from --reuse where it has them) and the --budgets forms, each
    yielded as (folder name, artifact) as soon as it is made, in the order issue 55's verdicts need them
    (made_in_order): the fewer-layer forms first (summarization's >= 5x faster form can only be one of them), each
    budget form right after the uniform 2-2-8 of its depth, then a budget form of the student (the student is made
    for it, and yielded as ("student", folder) first), then the forms of every layer, each equal budget right after
    its uniform form, 8-8-8 last; translation makes every layer first (Task.budgets_first)."""
    from modelshrink.quant.budget import BudgetTooSmall
    from modelshrink.quant.model import WEIGHTS_NAME
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    teacher, task = Path(args.teacher), TASKS[args.task]
    common = dict(model=str(teacher), data=str(train), lr=1e-4, warmup_ratio=0.05, save_every=100,
                  granularity=args.granularity, **training_budget(args))
    teacher_mb = weight_mb("torch", teacher)
    jobs = []  # (folder, uniform bits or None, budget text or None, decoder layers)
    for text in budgets(args, fewer):
        jobs.append((budget_folder(text), None, text, fewer if of_student(text) else budget_of(text)[1]))
    for name, bits, layers in (("888-6-6", "8-8-8", None), ("228-6-6", "2-2-8", None), ("228-6-3", "2-2-8", fewer),
                               *uniform):
        jobs.append((name, bits, None, layers))
    for text in budgets(args, fewer):
        layers = budget_of(text)[1]
        if equal_to(text) and (layers not in (None, fewer)
                               or uniform_folder(equal_to(text), layers) not in {job[0] for job in jobs}):
            depth = f" with {layers} decoder layers" if layers else ""
            sys.exit(f"frontier: budget {text} is the size of the uniform {equal_to(text)} form{depth}, which this run "
                     f"does not make (every layer: add it to --uniform; fewer layers: only =2-2-8:{fewer})")

    student = None
    made: dict[str, Path] = {}  # uniform folder -> its artifact (a budget form of its size reads it)
    for folder, bits, text, layers in sorted(jobs, key=lambda job: made_in_order(job, args.uniform, task.budgets_first)):
        steps = args.quantize_steps * (task.fewer_steps if layers else 1)  # a budget form: as the uniform of its depth
        if text is None:
            reused = Path(args.reuse) / folder if args.reuse else None
            if reused is not None and (reused / "modelshrink.json").is_file():
                made[folder] = reused
                yield folder, reused
                continue
            log(f"distillation-aware {bits}{f' with {layers} decoder layers' if layers else ''} ({steps} steps)")
            made[folder] = quantize(QuantizeOptions(bits=bits, decoder_layers=layers, max_steps=steps, **common),
                                    args.work / folder, resume=True, log=log)
            yield folder, made[folder]
        else:
            size = budget_of(text)[0]
            if equal_to(text):  # the uniform form's artifact, byte for byte: an equal budget, whatever the export adds
                mb = Path(made[uniform_folder(equal_to(text), layers)], WEIGHTS_NAME).stat().st_size / 1e6
            else:
                mb = artifact_budget(args, teacher_mb / float(size[:-1]) if size.endswith("x") else float(size),
                                     args.work / folder, layers, log, train)
            model = dict(decoder_layers=layers)
            if of_student(text):  # the student quantized, taught by the teacher (its layers map onto the teacher's)
                if student is None:
                    student = Path(args.student) if args.student else make_student(args, train, fewer, log)
                    yield "student", student
                model = dict(model=str(student), teacher=str(teacher))
            bits = budget_bits(args, args.work / folder, log, text)
            if mb <= 0:  # the export's graph alone is over the bound
                log(f"budget {text} skipped: the export's graph alone is larger than it")
                continue
            log(f"distillation-aware under a {mb:.2f} MB budget ({text}; {steps} steps)")
            try:
                of = "artifact" if equal_to(text) or args.budget_of == "artifact" else "export"
                made_form = quantize(QuantizeOptions(bits=bits, budget_mb=mb, budget_of=of,
                                                     calibration_examples=args.calibration_examples, max_steps=steps,
                                                     **{**common, **model}), args.work / folder, resume=True, log=log)
            except BudgetTooSmall as e:  # out of reach for this teacher: said, and the run goes on to the next form
                log(f"budget {text} skipped: {e}")
                continue
            yield folder, made_form


def made_in_order(job: tuple, uniform: list[str], budgets_first: bool = False) -> tuple:
    """The sort key of a quantize job (folder, uniform bits or None, budget text or None, decoder layers): the
    fewer-layer forms first (2-2-8, its other budgets, its equal budget), then the student's budget form, then every
    layer: 2-2-8, each --uniform form with its equal budget right after it, the other budgets, 8-8-8 (and its equal
    budget) last. `budgets_first` (the task row's) makes every layer first, its budgets (10x, 13x) right after
    2-2-8, then the fewer-layer forms and the student's. Jobs of one rank keep their order (sorted() is stable:
    --budgets' order)."""
    _, bits, text, layers = job
    same = equal_to(text) if text else None
    if layers is not None:
        rank = 0.0 if bits == "2-2-8" else 2.0 if same else 1.0
    else:  # an equal budget of bits that no uniform form here has was refused before (make_quantized)
        of = bits or same
        if of is None:
            rank = 0.25 if budgets_first else 1000.0
        elif of in ("2-2-8", "8-8-8"):
            rank = 0.0 if of == "2-2-8" else 2000.0
        else:
            rank = 1.0 + uniform.index(of)
        rank += 0.5 if same else 0.0
    return ((layers is None) != budgets_first, text is not None and of_student(text), rank)


def artifact_budget(args: argparse.Namespace, export_mb: float, folder: Path, layers: int | None, log,
                    train: Path | None = None) -> float:
    """`quantize --budget-mb --budget-of export` for an export of at most `export_mb`: less the graph the export adds
    to its artifact (nodes, the unpacking's constants; not the second copy of a shared table, which that budget
    counts), measured on the uniform 2-2-8 export of the same depth (made first) and on an untrained 4-4-8 one
    (`probe_448`): a plan mixes 2- and 4-bit groups, whose kernels add other constants (the translation teacher's
    10x plan added 0.603 MB where its 2-2-8 added 0.558), so the larger is taken. A finished budget form keeps the
    budget it was made with (--resume refuses another), said where it differs."""
    from modelshrink.artifacts import read_manifest

    uniform = args.work / ("onnx-228-fewer" if layers else "onnx-228")
    graph, probe = 0.0, None
    made = read_manifest(folder) if (folder / "modelshrink.json").is_file() else None
    if args.budget_of == "export" and (uniform / "modelshrink.json").is_file():
        graph = graph_mb(args, uniform, 2)
        if made is None and train is not None:  # what a finished form was made with is kept: no probe for it
            probe = probe_448(args, train, layers, log)
            graph = max(graph, graph_mb(args, probe, 4))
    mb = export_mb - max(graph, 0.0)
    if args.budget_of == "export":
        log(f"an export of at most {export_mb:.2f} MB: a {mb:.2f} MB budget of the export's weights "
            f"(`quantize --budget-of export`; {uniform.name}" + (f" and {probe.name}" if probe else "")
            + f" add up to {graph:.3f} MB of graph besides)")
    if made is not None and abs(made["options"]["budget_mb"] - mb) > 1e-9:
        log(f"{folder.name} is finished under a {made['options']['budget_mb']:.2f} MB budget: kept (remove it to "
            f"make it under {mb:.2f})")
        return made["options"]["budget_mb"]
    return mb


def graph_mb(args: argparse.Namespace, export: Path, bits: int) -> float:
    """What an export adds to its artifact, but the second copy (at `bits`) of a shared table, which `quantize
    --budget-of export` counts."""
    return weight_mb("onnx", export) - artifact_mb(export) - second_copy_mb(Path(args.teacher), bits)


def probe_448(args: argparse.Namespace, train: Path, layers: int | None, log) -> Path:
    """The teacher at `layers` decoder layers (`distill --max-steps 0`), quantized untrained to 4-4-8 (`quantize
    --method direct`) and exported without its check (kept when finished): only its graph's size is read."""
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    name = "probe-448-fewer" if layers else "probe-448"
    model = Path(args.teacher)
    if layers:
        model = distill(DistillOptions(data=str(train), teacher=str(model), decoder_layers=layers, max_steps=0,
                                       **training_budget(args)), args.work / f"{name}-float", resume=True, log=log)
    artifact = quantize(QuantizeOptions(model=str(model), bits="4-4-8", method="direct",
                                        granularity=args.granularity), args.work / name, resume=True, log=log)
    out = args.work / f"onnx-{name}"
    if not (out / "modelshrink.json").is_file():
        from modelshrink.steps.export import ExportOptions, export_model

        log(f"export {name} (its graph's size only)")
        export_model(ExportOptions(model=str(artifact), max_source_length=TASKS[args.task].max_source,
                                   validate=False), out, overwrite=True, log=log)
    return out


def second_copy_mb(teacher: Path, bits: int) -> float:
    """MB of the second copy, at `bits`, of a table the teacher's export holds in two graphs (a word-embedding
    table its encoder and decoder share; 0 where each has its own, as bert2bert's), made on the meta device."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from modelshrink.models.loading import load_config
    from modelshrink.quant.budget import copy_bytes, stored_twice
    from modelshrink.quant.groups import weight_groups

    with torch.device("meta"):
        model = AutoModelForSeq2SeqLM.from_config(load_config(str(teacher), "teacher"))
    return sum(copy_bytes(m, bits) for m in stored_twice(model, weight_groups(model)).values()) / 1e6


def budget_bits(args: argparse.Namespace, folder: Path, log, text: str | None = None) -> str:
    """--budget-bits for the budget form `text` (bits_for), or the bits a finished budget form was made with
    (--resume keeps it, and refuses other options), said where they differ."""
    from modelshrink.artifacts import read_manifest

    wanted = bits_for(args.budget_bits, text)
    made = read_manifest(folder)["options"]["bits"] if (folder / "modelshrink.json").is_file() else wanted
    if made != wanted:
        log(f"{folder.name} is finished with --bits {made}: kept (remove it to make it with {wanted})")
    return made


def bits_for(budget_bits: str, text: str | None) -> str:
    """--budget-bits as the budget form `text` takes it: a budget the size of a uniform form above the narrowest
    bits (=4-4-8, =2-8-8) leaves out the position tables' pin, so that they stay float as that uniform form keeps
    them and the two differ only in how the same bytes are allocated; =2-2-8 keeps the pin, the one thing to
    allocate at that size (every other weight of uniform 2-2-8 is at the narrowest bits already)."""
    if text is None or equal_to(text) in (None, "2-2-8"):
        return budget_bits
    rules = [rule for rule in budget_bits.split(",") if not rule.partition("=")[0].strip().endswith("positions")]
    return ",".join(rules)


def budgets(args: argparse.Namespace, fewer: int) -> list[str]:
    """--budgets, or the default: 10x and 13x with every layer, 10x with the fewer decoder layers, one the size of
    the fewer-layer 2-2-8, 10x of the student (which has those layers), and one the size of uniform 2-8-8 and one of
    4-4-8 (issue 55's equal-budget comparisons) where --uniform makes them."""
    if args.budgets is not None:
        return args.budgets
    # the size of the fewer-layer 2-2-8 where --budget-bits quantizes the position tables (every other weight of
    # that form is at the narrowest bits already: only what the tables free is there to allocate)
    equal_depth = [f"=2-2-8:{fewer}"] if "positions=" in (args.budget_bits or "") else []
    equal = [f"={bits}" for bits in ("2-8-8", "4-4-8") if bits in args.uniform]
    return ["10x", "13x", f"10x:{fewer}", *equal_depth, "10x:student", *equal]


def equal_to(text: str) -> str | None:
    """"=4-4-8" -> "4-4-8", "=2-2-8:3" -> "2-2-8": a budget form the size of that uniform form's artifact (every
    layer, or :D decoder layers), compared with it at an equal budget; None for any other budget."""
    return text[1:].partition(":")[0] if text.startswith("=") else None


def uniform_folder(bits: str, layers: int | None = None) -> str:
    """The folder of the uniform `bits` form with every layer, or with the fewer decoder layers (2-2-8 alone)."""
    if layers:
        return "228-6-3" if bits == "2-2-8" else f"{bits.replace('-', '')}-fewer"
    return {"2-2-8": "228-6-6", "8-8-8": "888-6-6"}.get(bits, bits.replace("-", "") + "-all")


def of_student(text: str) -> bool:
    """Whether a budget form quantizes the distilled student ("10x:student") rather than the teacher."""
    return text.endswith(":student")


def budget_of(text: str) -> tuple[str, int | None]:
    """"10x" -> ("10x", None); "10x:3" -> ("10x", 3): the size, and the decoder layers (None: the teacher's, or the
    student's for "10x:student")."""
    size, _, layers = text.partition(":")
    return size, int(layers) if layers.isdigit() else None


def budget_list(text: str) -> list[str]:
    """--budgets' value: "10x,13x,10x:3,10x:student" -> its items, each MB or Nx, with :D (decoder layers),
    :student or neither."""
    items = [b.strip() for b in text.split(",") if b.strip()]
    for item in items:
        if not re.fullmatch(r"(\d+(\.\d+)?)x?(:([1-9]\d*|student))?|=\d-\d-\d(:[1-9]\d*)?", item):
            raise argparse.ArgumentTypeError(f"{item!r} is not a budget: MB (15, 19.5) or Nx (10x), optionally "
                                             "with :D decoder layers (10x:3) or of the student (10x:student), or "
                                             "=W-E-A, the size of that uniform form (=4-4-8; =2-2-8:3 with 3 "
                                             "decoder layers)")
    return items


def budget_folder(text: str) -> str:
    if equal_to(text):
        layers = budget_of(text)[1]
        return "budget-as-" + equal_to(text).replace("-", "") + (f"-d{layers}" if layers else "")
    size, layers = budget_of(text)
    return f"budget-{size}" + (f"-d{layers}" if layers else "-student" if of_student(text) else "")


def budget_name(text: str, fewer: int) -> str:
    if equal_to(text):
        layers = budget_of(text)[1]
        return f"budget = {equal_to(text)}{f' (D {layers})' if layers else ''} distillation-aware, ONNX"
    size, layers = budget_of(text)
    where = f" of the student (D {fewer})" if of_student(text) else f" (D {layers})" if layers else ""
    return f"budget {size}{where} distillation-aware, ONNX"


def exported(args: argparse.Namespace, model: Path, name: str, log, **flags) -> Path:
    """`export` of `model` into onnx-NAME (kept when finished)."""
    from modelshrink.steps.export import ExportCheckFailed, ExportOptions, export_model

    out = args.work / f"onnx-{name}"
    if not (out / "modelshrink.json").is_file():
        log(f"export {name}")
        try:
            export_model(ExportOptions(model=str(model), max_source_length=TASKS[args.task].max_source,
                                       validate=not args.no_export_check, **flags), out, overwrite=True, log=log)
        except ExportCheckFailed as e:  # the folder is written; the frontier still measures it, and says so
            log(f"{name}: {e}")
    return out


def make_forms(args: argparse.Namespace, train: Path, log, ready=None) -> dict[str, tuple[str, Path]]:
    """Every deployable form: name -> (kind, folder), made or reused, in the table's order; `ready(name, form)` is
    called as each one is done, before the next is trained, so that a long run can score it at once. The teacher's forms come first, then the quantize forms (make_quantized's
    order), the student last: issue 55's verdicts need the quantize forms and not the student."""
    from modelshrink.families import decoder_layer_count
    from modelshrink.models.loading import load_config

    teacher = Path(args.teacher)
    fewer = args.decoder_layers or max(1, decoder_layer_count(load_config(str(teacher), "teacher")) // 2)
    uniform = [(bits.replace("-", "") + "-all", bits, None) for bits in args.uniform]
    names = {"888-6-6": ("8-8-8 distillation-aware, ONNX", "888"), "228-6-6": ("2-2-8 distillation-aware, ONNX", "228"),
             "228-6-3": (f"2-2-8 (D {fewer}) distillation-aware, ONNX", "228-fewer"),
             **{name: (f"{bits} distillation-aware, ONNX", name) for name, bits, _ in uniform},
             **{budget_folder(text): (budget_name(text, fewer), budget_folder(text)) for text in budgets(args, fewer)}}
    students = [(f"student (D {fewer}), ONNX {label}", f"student-{flag or 'fp32'}", flag)
                for label, flag in (("float32", None), ("--int8", "int8"), ("--int4", "int4"))]
    table = [TEACHER, "teacher, ONNX float32", *(name for name, _, _ in students),
             *(name for name, _ in names.values())]
    forms: dict[str, tuple[str, Path]] = {}

    def add(name: str, form: tuple[str, Path]) -> None:
        forms[name] = form
        if ready is not None:
            ready(name, form)

    def onnx(model: Path, name: str, **flags) -> tuple[str, Path]:
        return "onnx", exported(args, model, name, log, **flags)

    add(TEACHER, ("torch", teacher))
    add("teacher, ONNX float32", onnx(teacher, "teacher-fp32"))
    def add_student(student: Path) -> None:
        for name, export_name, flag in students:
            add(name, onnx(student, export_name, **({flag: True} if flag else {})))

    for folder, model in make_quantized(args, train, fewer, uniform, log):
        if folder == "student":  # made for a budget form of it: its own forms are scored now
            add_student(model)
            continue
        name, export_name = names[folder]
        add(name, onnx(model, export_name))
    if students[0][0] not in forms:
        add_student(Path(args.student) if args.student else make_student(args, train, fewer, log))
    return {name: forms[name] for name in table if name in forms}  # a budget out of reach is not made


def scored(args: argparse.Namespace, model: Path, validation: Path, out: Path, log, against: Path | None = None
           ) -> dict:
    """`eval` of `model` on the first --docs rows with the task's search (resumed, or read back when finished)."""
    from modelshrink.options.eval import EvalOptions
    from modelshrink.steps.evaluate import evaluate

    task = TASKS[args.task]
    # allow_empty: a form that writes nothing (a collapsed 2-bit one, a --tiny teacher) scores 0, as it should
    _, metrics = evaluate(EvalOptions(model=str(model), data=str(validation), limit=args.docs, latency_docs=0,
                                      max_source_length=task.max_source, against=None if against is None else
                                      str(against), allow_empty=True, **task.generation), out, resume=True, log=log)
    metrics = metrics or json.loads((out / "metrics.json").read_text())  # a finished artifact kept as it was
    if metrics["task"] != task.name:
        raise RuntimeError(f"{model} on {validation} was scored as {metrics['task']}, not as {task.name}")
    return metrics


def eval_folder(args: argparse.Namespace, name: str, path: Path | None) -> Path:
    """A form's `eval` artifact, named after the form's own folder (eval-budget-10x-student for
    onnx-budget-10x-student), so that a form added to the table never takes another's scores."""
    return args.work / ("eval-teacher" if name == TEACHER else f"eval-{Path(path).name.removeprefix('onnx-')}")


def quality_of(args: argparse.Namespace, name: str, path: Path, validation: Path, log) -> dict:
    """One form's metrics with intervals, tested against the teacher's (scored first: the teacher is form 0)."""
    task = TASKS[args.task]
    log(f"evaluating {name} on {args.docs} {task.rows}")
    reference = eval_folder(args, TEACHER, None)
    metrics = scored(args, path, validation, eval_folder(args, name, path), log,
                     against=None if name == TEACHER else reference)
    return {"scores": {k: metrics[k] for k in task.metrics}, "ci95": metrics["ci95"],
            "against_teacher": metrics.get("against", {}).get("p"), "eval": str(eval_folder(args, name, path))}


def quality(forms: dict[str, tuple[str, Path]], validation: Path, args: argparse.Namespace, log) -> dict[str, dict]:
    """The task's metrics with intervals of every form, each tested against the teacher (eval artifacts in
    --work; those scored while the forms were made are read back)."""
    return {name: quality_of(args, name, path, validation, log) for name, (_, path) in forms.items()}


def scored_at_once(args: argparse.Namespace, validation: Path, log):
    """make_forms' `ready`: score each form as soon as it is made and record it in --work's progress.json (form ->
    scores, interval, p against the teacher, when), so that a run of many hours (and sessions) gives each number
    when it has it, not all at the end."""
    progress = args.work / "progress.json"

    def ready(name: str, form: tuple[str, Path]) -> None:
        found = quality_of(args, name, form[1], validation, log)
        rows = json.loads(progress.read_text()) if progress.is_file() else {}
        before = rows.get(name, {})  # a rerun reads a finished form's scores back: it keeps when they were made
        when = before["scored"] if before.get("scores") == found.get("scores") else time.strftime("%Y-%m-%d %H:%M")
        rows[name] = {"path": str(form[1]), "scored": when, **found}
        progress.with_suffix(".tmp").write_text(json.dumps(rows, indent=2) + "\n")
        progress.with_suffix(".tmp").replace(progress)

    return ready


def pytorch_forms(forms: dict[str, tuple[str, Path]]) -> dict[str, Path]:
    """Each exported form's PyTorch model: the `model` its export was made from (its manifest's parent)."""
    from modelshrink.artifacts import read_manifest

    found = {}
    for name, (kind, path) in forms.items():
        if kind == "onnx":
            parent = next(p for p in read_manifest(path)["parents"] if p["role"] == "model")
            found[name] = Path(parent["path"])
    return found


def against_pytorch(forms: dict[str, tuple[str, Path]], results: dict[str, dict], validation: Path,
                    args: argparse.Namespace, log) -> dict[str, dict]:
    """Each exported form's main metric (ROUGE-L, BLEU) against its PyTorch form's, on the same rows: {name:
    {METRIC, "ci95", "within"}}, `within` whether the export's score lies in the PyTorch form's 95% interval (each
    PyTorch model evaluated once, in eval-pytorch-FOLDER; the teacher's is the frontier's first row)."""
    main = TASKS[args.task].main
    teacher = Path(forms[TEACHER][1]).resolve()
    done: dict[Path, dict] = {teacher: {main: results[TEACHER]["scores"][main],
                                        "ci95": results[TEACHER]["ci95"][main]}}
    found = {}
    for name, model in pytorch_forms(forms).items():
        model = model.resolve()
        if model not in done:
            log(f"evaluating the PyTorch form of {name} ({model}) on {args.docs} {TASKS[args.task].rows}")
            metrics = scored(args, model, validation, args.work / f"eval-pytorch-{model.name}", log)
            done[model] = {main: metrics[main], "ci95": metrics["ci95"][main], "path": str(model)}
        low, high = done[model]["ci95"]
        found[name] = {**done[model], "within": low <= results[name]["scores"][main] <= high}
    return found


def made_from(form: Path) -> Path:
    """The PyTorch artifact an export folder was made from."""
    return pytorch_forms({"form": ("onnx", form)})["form"]


def artifact_mb(form: Path) -> float:
    """MB of the quantize artifact an export was made from (the size a budget bounds)."""
    from modelshrink.quant.model import WEIGHTS_NAME

    return Path(made_from(form), WEIGHTS_NAME).stat().st_size / 1e6


def budget_against_uniform(forms: dict[str, tuple[str, Path]], results: dict[str, dict], args: argparse.Namespace,
                           log) -> list[dict]:
    """Each budget form against the uniform-bits form of its depth (all layers, or the fewer-layer 2-2-8) nearest its
    size, on the same rows: the task's metrics and a paired permutation test (`eval --compare` on the two eval
    artifacts, nothing generated again)."""
    from modelshrink.artifacts import read_manifest
    from modelshrink.evaluation.compare import compare

    metrics = TASKS[args.task].metrics

    def depth(name: str) -> str:  # "(D 3)", or "" for every layer
        return name[name.index("(D "):name.index(")") + 1] if "(D " in name else ""

    found = []
    for name, (_, path) in forms.items():
        if not name.startswith("budget ") or " of the student " in name:  # a student's had more steps than any uniform
            continue
        uniform = {u: artifact_mb(p) for u, (_, p) in forms.items()
                   if u.split(" ")[0] in [*args.uniform, "2-2-8", "8-8-8"] and depth(u) == depth(name)}
        size = artifact_mb(path)
        nearest = min(uniform, key=lambda u: abs(uniform[u] - size))
        if name.startswith("budget = "):  # the size of a uniform form: compared with that one
            nearest = name.removeprefix("budget = ")
        out = args.work / f"compare-{path.name.removeprefix('onnx-')}"
        log(f"{name} ({size:.2f} MB) against {nearest} ({uniform[nearest]:.2f} MB)")
        _, report = compare([results[nearest]["eval"], results[name]["eval"]], out, overwrite=True)
        p = report["systems"][1]["p_vs_first"]
        plan = read_manifest(made_from(path))["metrics"]["bit_plan"]  # what measuring sensitivity cost
        found.append({"budget": name, "budget_mb": size, "uniform": nearest, "uniform_mb": uniform[nearest],
                      "sensitivity_seconds": plan["sensitivity_seconds"],
                      "sensitivity_share": plan["sensitivity_share_of_training"],
                      **{k: results[name]["scores"][k] - results[nearest]["scores"][k] for k in metrics},
                      "p": {k: p.get(k) for k in metrics}})
    return found


def budget_table(rows: list[dict], task: Task) -> list[str]:
    lines = ["| budget form | artifact MB | uniform form of its depth nearest in size | artifact MB | "
             + "".join(f"Δ {task.label(k)} | " for k in task.metrics) + f"p ({task.short}) | "
             "sensitivity measured in s (share of the training's time) |",
             "|" + "---|" * (6 + len(task.metrics))]
    for r in rows:
        lines.append(f"| {r['budget']} | {r['budget_mb']:.2f} | {r['uniform']} | {r['uniform_mb']:.2f} | "
                     + "".join(f"{r[k]:+.2f} | " for k in task.metrics) + f"{r['p'][task.main]:.3f} | "
                     f"{r['sensitivity_seconds']:.0f} ({100 * r['sensitivity_share']:.1f}%) |")
    return lines


def batch1_threads(kind: str, path: Path, task: Task, docs: list[str]) -> int | None:
    """The onnxruntime threads an export folder serves batch 1 fastest on, one or every core: the two take turns on
    `docs` (4 documents that are not timed afterwards) after an untimed one each (at batch 1 a small graph's
    operators gain less from a second thread than waking it costs). None for a PyTorch form, which runs on every
    core (the MiniLM teacher: 316 ms on 2 threads against 515 on 1, 24 tokens, 2026-12-03)."""
    cores = len(os.sched_getaffinity(0))
    if kind != "onnx" or cores == 1 or not docs:
        return None if kind != "onnx" else cores
    runs = {threads: summarizer(kind, path, task, threads) for threads in (1, cores)}
    times: dict[int, list[float]] = {threads: [] for threads in runs}
    for run in runs.values():
        run(docs[:1], 1)
    for doc in docs:
        for threads, run in runs.items():
            start = time.perf_counter()
            run([doc], 1)
            times[threads].append(time.perf_counter() - start)
    return min(times, key=lambda threads: statistics.median(times[threads]))


def speed(forms: dict[str, tuple[str, Path]], docs: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """Batch-1 p50/p90 seconds, twice: with the forms taking turns document by document (a change of load hits all
    alike, but each form finds the caches holding the others' weights) and with each form alone on the documents,
    as a process serving that one model runs (one untimed document first; --rounds rounds, the forms in a rotating
    order, so that drift hits all alike), each export on the threads it serves batch 1 fastest on
    (`batch1_threads`); and batch-16 docs/s on every core (median of --rounds passes)."""
    task = TASKS[args.task]
    untimed = docs[max(args.latency_docs, args.throughput_docs):][:4]  # documents the rounds below do not time
    threads = {name: batch1_threads(kind, path, task, untimed) for name, (kind, path) in forms.items()}
    runs = {name: summarizer(kind, path, task, threads[name]) for name, (kind, path) in forms.items()}
    bulk = {name: runs[name] if threads[name] in (None, len(os.sched_getaffinity(0))) else summarizer(kind, path, task)
            for name, (kind, path) in forms.items()}
    for run in runs.values():
        run(docs[:2], 1)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for doc in docs[:args.latency_docs]:
        for name, run in runs.items():
            start = time.perf_counter()
            run([doc], 1)
            times[name].append(time.perf_counter() - start)
    alone: dict[str, list[float]] = {name: [] for name in runs}
    passes: dict[str, list[float]] = {name: [] for name in runs}
    batch_docs = docs[:args.throughput_docs]
    for turn in range(args.rounds):
        order = list(runs.items())
        for name, run in order[turn % len(order):] + order[:turn % len(order)]:
            run(docs[-1:], 1)  # the caches now hold this form's weights
            for doc in docs[:args.latency_docs]:
                start = time.perf_counter()
                run([doc], 1)
                alone[name].append(time.perf_counter() - start)
            bulk[name](docs[-1:], 1)
            start = time.perf_counter()
            bulk[name](batch_docs, 16)
            passes[name].append(len(batch_docs) / (time.perf_counter() - start))
    return {name: {"p50_ms": statistics.median(times[name]) * 1e3, "p90_ms": _p90(times[name]) * 1e3,
                   "p50_alone_ms": statistics.median(alone[name]) * 1e3, "batch1_threads": threads[name],
                   "docs_s": statistics.median(passes[name]), "passes": passes[name]}
            for name in runs}


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def faster(base: dict, r: dict) -> float:
    """How many times faster than the teacher at batch 1: the smaller of the two measures (taking turns, alone)."""
    return min(base["p50_ms"] / r["p50_ms"], base["p50_alone_ms"] / r["p50_alone_ms"])


def figure(results: dict[str, dict], task: Task, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, (name, r) in enumerate(results.items(), 1):  # numbered points, named in the legend: names overlap
        ax.scatter(r["p50_ms"], r["scores"][task.main], s=max(r["mb"], 1) * 2, alpha=0.5,
                   label=f"{index}. {name}, {r['mb']:.0f} MB")
        ax.annotate(str(index), (r["p50_ms"], r["scores"][task.main]), fontsize=8, ha="center", va="center")
    ax.legend(fontsize=7, loc="lower right", markerscale=0.3)
    ax.set_xscale("log")
    ax.set_xlabel("batch-1 latency, p50 (ms, log scale)")
    ax.set_ylabel(task.label(task.main))
    ax.set_title("What the chain buys (marker area: MB on disk)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def quality_header(task: Task) -> str:
    return ("| form | " + "".join(f"{task.label(k)}{' [95% CI]' if k == task.main else ''} | " for k in task.metrics)
            + f"p vs teacher ({task.short}) | ")


def quality_cells(name: str, r: dict, task: Task) -> str:
    """A form's row up to its p against the teacher: the task's metrics, the main one with its interval."""
    ci, p = r["ci95"][task.main], (r["against_teacher"] or {}).get(task.main)
    return (f"| {name} | " + "".join(f"{r['scores'][k]:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if k == task.main
                                                                 else "") + " | " for k in task.metrics)
            + f"{'' if p is None else f'{p:.3f}'} | ")


def table(results: dict[str, dict], task: Task) -> list[str]:
    base = results[TEACHER]
    lines = [quality_header(task) + "MB | × smaller | peak RSS MB | p50 ms | p90 ms | × faster (p50) | "
             "p50 ms alone | × faster alone | docs/s batch 16 |", "|" + "---|" * (11 + len(task.metrics))]
    for name, r in results.items():
        lines.append(quality_cells(name, r, task) + f"{r['mb']:.1f} | "
                     f"{base['mb'] / r['mb']:.1f} | {r['rss_mb']:.0f} | {r['p50_ms']:.0f} | {r['p90_ms']:.0f} | "
                     f"{base['p50_ms'] / r['p50_ms']:.2f} | {r['p50_alone_ms']:.0f} | "
                     f"{base['p50_alone_ms'] / r['p50_alone_ms']:.2f} | {r['docs_s']:.2f} |")
    return lines


def pytorch_table(results: dict[str, dict], task: Task) -> list[str]:
    label, main = task.label(task.main), task.main
    lines = [f"| exported form | {label} | its PyTorch form's {label} [95% CI] | within the interval |",
             "|---|---|---|---|"]
    for name, r in results.items():
        if "pytorch" in r:
            t = r["pytorch"]
            lines.append(f"| {name} | {r['scores'][main]:.2f} | {t[main]:.2f} [{t['ci95'][0]:.2f}, "
                         f"{t['ci95'][1]:.2f}] | {'yes' if t['within'] else 'no'} |")
    return lines


def verdict(results: dict[str, dict], task: Task) -> str:
    base, label = results[TEACHER], task.label(task.main)

    def lost(name: str) -> float:  # the teacher's score less the form's
        return base["scores"][task.main] - results[name]["scores"][task.main]

    met = [name for name, r in results.items() if name != TEACHER and base["mb"] / r["mb"] >= 4
           and faster(base, r) >= 3 and lost(name) <= TOLERANCE]
    if met:
        return (f"Target met (≥ 4× smaller, ≥ 3× faster at batch 1, {task.within} of the teacher): "
                + ", ".join(met))

    def shortfall(name: str) -> float:  # how far from each of the three bars, each as a share of its bar
        r = results[name]
        return (max(0.0, 4 - base["mb"] / r["mb"]) / 4 + max(0.0, 3 - faster(base, r)) / 3
                + max(0.0, lost(name) - TOLERANCE))

    nearest = min((n for n in results if n != TEACHER), key=shortfall)
    r = results[nearest]
    return (f"Target not met: no form is ≥ 4× smaller and ≥ 3× faster with {task.within} of the teacher; "
            f"nearest: {nearest} ({base['mb'] / r['mb']:.1f}× smaller, {faster(base, r):.2f}× faster, "
            f"{label} {r['scores'][task.main] - base['scores'][task.main]:+.2f})")


def verdict_budget(results: dict[str, dict], task: Task) -> str:
    """Issue 55's target: a form >= 10x smaller than the teacher's float32, >= 5x faster at batch 1 than the teacher
    in PyTorch, within 1.0 of its ROUGE-L (summarization) or BLEU (translation)."""
    base, main = results[TEACHER], task.main
    bars = f"(≥ 10× smaller, ≥ 5× faster, {task.within})"
    met = [name for name, r in results.items() if name != TEACHER and base["mb"] / r["mb"] >= 10
           and faster(base, r) >= 5 and base["scores"][main] - r["scores"][main] <= TOLERANCE]
    if met:
        return f"Issue 55's target met {bars}: " + ", ".join(met)
    small = [n for n, r in results.items() if n != TEACHER and base["mb"] / r["mb"] >= 10]
    best = max(small, key=lambda n: results[n]["scores"][main]) if small else None
    return (f"Issue 55's target not met {bars}" + (
        f"; the best form ≥ 10× smaller: {best} ({task.label(main)} "
        f"{results[best]['scores'][main] - base['scores'][main]:+.2f}, "
        f"{faster(base, results[best]):.2f}× faster)" if best else ""))


class Arguments(argparse.ArgumentParser):
    """--task's row fills what the command line left unset (--data, --teacher, --work, --pair, --figure, the steps
    and the token budget), whichever order the options came in."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        task = TASKS[parsed.task]
        if parsed.pair is not None and task.pair is None:
            self.error(f"--pair names a language pair of --task translation's data, not of --task {task.name}")
        defaults = dict(data=str(task.data), teacher=task.teacher, work=task.work, pair=task.pair, figure=task.figure,
                        **task.defaults)
        for key, value in defaults.items():
            if getattr(parsed, key) is None:
                setattr(parsed, key, value)
        return parsed, rest


def arguments() -> argparse.ArgumentParser:
    parser = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=list(TASKS), default="summarization",
                        help="what the teacher does, and so how it is scored [default: summarization]")
    parser.add_argument("--teacher", help="the float seq2seq teacher [default: runs/repro/teacher; translation: "
                        f"{TASKS['translation'].teacher}]")
    parser.add_argument("--data", help="[default: ../shared/data/debian-descriptions; translation: "
                        "../shared/data/debian-translations]")
    parser.add_argument("--pair", help="translation: the language pair of --data's files [default: en-de]")
    parser.add_argument("--work", type=Path, help="artifacts and frontier.json [default: runs/frontier; translation: "
                        "runs/frontier-translation]")
    parser.add_argument("--reuse", help=f"{TASKS['summarization'].reuse} (translation: "
                        f"{TASKS['translation'].reuse}): its 888-6-6, 228-6-6, 228-6-3")
    parser.add_argument("--student", help="a student to reuse instead of distilling one")
    parser.add_argument("--uniform", type=lambda t: [b for b in t.split(",") if b],
                        help="more uniform W-E-A forms, all layers, comma-separated ('' for none), each made with its "
                        "equal budget (=W-E-A, in the default --budgets) right after it [default: 2-8-8,4-4-8,3-3-8; "
                        "translation: 4-4-8,3-3-8; 3-3-8 last, as its 3-bit codes are stored in 4 bits]")
    parser.add_argument("--budgets", type=budget_list,
                        help="budget forms, comma-separated: MB, or Nx (the teacher's float32 weights over N), each "
                        "with :D for D decoder layers or :student for the distilled student ('' for none) "
                        "[default: 10x,13x,10x:D,=2-2-8:D,10x:student,=4-4-8, D: --decoder-layers; =4-4-8: the "
                        "size of uniform 4-4-8, where --uniform makes it; =2-2-8:D: of the fewer-layer 2-2-8]")
    parser.add_argument("--granularity", choices=("row", "tensor"), default="row",
                        help="weight scales of every quantize form (quantize --granularity) [default: row: per tensor, "
                        "4 bits round the MiniLM teacher's feed-forward weights worse than ternary does]")
    parser.add_argument("--budget-bits", help="quantize --bits of every budget form: the activation bits and the "
                        "groups pinned [default: 8-8-8,positions=8: the learned position tables in 8 bits, a quarter "
                        "of their float bytes, every other group chosen; translation: 8-8-8, its Marian-shaped "
                        "teacher's positions are sinusoids, never stored; a finished form keeps what it was made with]")
    parser.add_argument("--budget-of", choices=("export", "artifact"), default="export",
                        help="what a budget bounds: the export (quantize's budget less the graph the uniform 2-2-8 "
                        "export of that depth adds) or the quantize artifact alone [default: export]")
    parser.add_argument("--calibration-examples", type=int, default=64, help="training examples each budget form's "
                        "sensitivity is measured on (quantize --calibration-examples) [default: 64]")
    parser.add_argument("--decoder-layers", type=int, help="the student's and the fewer-layer 2-2-8's [default: half]")
    parser.add_argument("--student-steps", type=int, help="[default: 1500; translation: 1200]")
    parser.add_argument("--trim-vocab", action=argparse.BooleanOptionalAction, help="the student keeps only the "
                        "tokens of the training data (distill --trim-vocab), and so does every form made from it "
                        "[default: on; translation: off, its BPE was trained on these pairs]")
    parser.add_argument("--quantize-steps", type=int, help="[default: 300; translation: 600, and twice that for the "
                        "fewer-layer 2-2-8]")
    parser.add_argument("--max-tokens", type=int, help="padded tokens a training batch [default: 3072; translation: "
                        "4096]")
    parser.add_argument("--docs", type=int, default=1000, help="validation documents (or pairs) scored")
    parser.add_argument("--latency-docs", type=int, default=20)
    parser.add_argument("--throughput-docs", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--figure", type=Path, help="[default: benchmarks/frontier.png; translation: "
                        "benchmarks/frontier-translation.png]")
    parser.add_argument("--tiny", action="store_true", help="a random tiny BART on the bundled sample (translation: "
                        "a small Marian trained for 60 steps on pairs made from it): a smoke run")
    parser.add_argument("--no-export-check", action="store_true", help="export without checking against PyTorch "
                        "(a smoke run; the frontier still scores every export against its PyTorch form)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--progress", action="store_true", help="print the forms scored so far (--work's "
                        "progress.json) as a table, and stop: the numbers of a run still under way")
    parser.add_argument("--rss-of", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    return parser


def progress_table(args: argparse.Namespace) -> list[str]:
    """The forms a run under way has scored so far: the task's metrics, the interval and p against the teacher, MB
    on disk and how many times smaller than the teacher (no speed: that is measured once every form is made)."""
    task, progress = TASKS[args.task], args.work / "progress.json"
    if not progress.is_file():
        sys.exit(f"frontier: no {progress} yet (no form has been scored)")
    rows = json.loads(progress.read_text())
    mb = {name: weight_mb("torch" if name == TEACHER else "onnx", Path(r["path"])) for name, r in rows.items()}
    lines = [quality_header(task) + "MB | × smaller | scored |", "|" + "---|" * (5 + len(task.metrics))]
    for name, r in rows.items():
        lines.append(quality_cells(name, r, task) + f"{mb[name]:.1f} | "
                     + (f"{mb[TEACHER] / mb[name]:.1f}" if TEACHER in mb and mb[name] else "") + f" | {r['scored']} |")
    return lines


def one_thread(results: dict[str, dict]) -> str:
    """Which exports batch 1 ran on one thread, in words."""
    if len(os.sched_getaffinity(0)) == 1:
        return "one core: one thread"
    names = [name for name, r in results.items() if r.get("batch1_threads") == 1]
    return f"one thread: {', '.join(names)}" if names else "every export on every core"


def report(args: argparse.Namespace, results: dict[str, dict], budgets: list[dict], validation: Path) -> str:
    """The BENCHMARKS.md section: how it was run, the table, the verdicts, each export against its PyTorch form
    and each budget form against its uniform one."""
    import onnxruntime
    import torch

    task = TASKS[args.task]
    command = "python benchmarks/frontier.py " + " ".join(sys.argv[1:])
    return "\n".join([
        f"Teacher `{args.teacher}`; the first {args.docs} {task.rows} of {os.path.relpath(validation)} "
        f"({task.search}); {task.scoring}; latency over {args.latency_docs} {task.rows} taken in turn by every "
        f"form (p50) and by each form alone ({args.rounds} rounds, after one untimed; p50 alone), × faster: the "
        f"teacher's p50 over the form's, a target met on the smaller of the two; "
        f"batch 16 over {args.throughput_docs} {task.rows} ({args.rounds} passes); {len(os.sched_getaffinity(0))} "
        f"threads, but at batch 1 each export on the onnxruntime threads it was fastest on, timed alone on 4 "
        f"{task.rows} each way ({one_thread(results)}). The student and the forms made from it keep "
        + ("only the tokens of the training data (`distill --trim-vocab`)" if args.trim_vocab
           else "the teacher's vocabulary")
        + f". Machine: {cpu()}, {os.cpu_count()} cores, torch {torch.__version__}, onnxruntime "
        f"{onnxruntime.__version__}. Command: `{command}` ({time.strftime('%Y-%m-%d')}).", "",
        *table(results, task), "", verdict(results, task), "", verdict_budget(results, task), "",
        f"Each exported form against the PyTorch model it was exported from, on the same {task.rows}:", "",
        *pytorch_table(results, task),
        *(["", "Each budget form against the uniform-bits form of its depth nearest its size (sizes: the quantize "
           "artifacts; the budget bounds "
           + ("the export (an artifact's budget: the export's less the graph it adds)" if args.budget_of == "export"
              else "the artifact")
           + f"; same steps and data), paired permutation test on the same {task.rows}:", "",
           *budget_table(budgets, task)] if budgets else [])])


def main() -> None:
    args = arguments().parse_args()
    task = TASKS[args.task]
    if args.rss_of:  # the child process of peak_rss_mb
        summarizer(args.rss_of[0], Path(args.rss_of[1]), task)(json.loads(sys.stdin.read()), 16)
        # VmHWM, not getrusage's ru_maxrss: Linux keeps that across exec, so a child forked from this (large)
        # process would start at the parent's peak
        status = Path("/proc/self/status").read_text().splitlines()
        print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024)  # kB
        return
    if args.progress:
        print("\n".join(progress_table(args)))
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    args.work.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        teacher, data = task.tiny(args.work, task, args.pair)
        args.teacher, args.data = str(teacher), str(data)
    train, validation = (task.split(args.data, split, args.pair) for split in ("train", "validation"))
    if not train.is_file() or not Path(args.teacher, "config.json").is_file():
        sys.exit(f"frontier: needs a teacher ({args.teacher}) and {train}; make the teacher with {task.recipe}")
    forms = make_forms(args, train, log, ready=scored_at_once(args, validation, log))
    results = quality(forms, validation, args, log)
    for name, found in against_pytorch(forms, results, validation, args, log).items():
        results[name]["pytorch"] = found
    docs = [row[task.text] for row in read_rows(validation, max(args.latency_docs, args.throughput_docs, 16) + 4)]
    for name, (kind, path) in forms.items():
        results[name]["mb"] = weight_mb(kind, path)
        results[name]["rss_mb"] = peak_rss_mb(kind, path, docs[:16], task)
    for name, measured in speed(forms, docs, args).items():
        results[name].update(measured)
    budgets = budget_against_uniform(forms, results, args, log)
    (args.work / "frontier.json").write_text(json.dumps({"task": task.name, "forms": {n: [k, str(p)] for n, (k, p)
                                                                                      in forms.items()},
                                                         "results": results, "budgets": budgets}, indent=2) + "\n")
    if not args.no_write:
        figure(results, task, args.figure)
    publish(task.section, task.title, report(args, results, budgets, validation),
            write=not args.no_write and not args.tiny)


if __name__ == "__main__":
    main()
