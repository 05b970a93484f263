"""The tasks of benchmarks/frontier.py (--task): one row each, holding all that differs between a summarization
teacher scored by ROUGE and a translation teacher scored by BLEU, so that the script reads its metrics, search,
lengths, data, defaults, report and smoke-run set-up from the row and never tests the task's name.

summarization  the Debian descriptions' teacher (recipes/teacher-debian.sh) with REPRODUCTION.md's Table 1
               settings: beam 4, no repeated trigram, sources <= 128 tokens, summaries <= 32; ROUGE-1/2/L, the
               verdicts on ROUGE-L; quantize runs of 300 steps of 3,072 tokens (recipes/dq-bart-debian.sh, small)
translation    DQ-BART Table 2's teacher (recipes/dq-bart-translation.sh: a Marian-shaped 6+6 trained from scratch
               on the Debian translations) with that recipe's settings: beam 4, translations and sources <= 128
               tokens, no n-gram blocking; sacreBLEU's BLEU and chrF as `eval` scores a translation, the verdicts
               on BLEU; quantize runs of its SCALE=small budget: 600 steps of 4,096 tokens at lr 1e-4, the one with
               fewer decoder layers twice as many. That recipe trains no student; the student gets what its
               half-decoder quantize runs get (1,200 steps at lr 1e-4), which also start from the teacher's layers.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from modelshrink.metrics.names import RESULT_METRICS

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SAMPLE = ROOT / "src" / "modelshrink" / "samples" / "debian"  # the bundled Debian descriptions


def tiny_summarization(work: Path, task: Task, pair: str | None) -> tuple[Path, Path]:
    """A random BART of the smoke-run shape and the bundled sample, gzipped as --data expects."""
    from peers import SMALL, build_model

    teacher, data = work / "teacher", work / "data"
    if not (teacher / "config.json").is_file():
        build_model(teacher, SMALL, seed=0)
    data.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation"):
        with open(SAMPLE / f"{split}.jsonl", "rb") as f, gzip.open(task.split(data, split, pair), "wb") as g:
            shutil.copyfileobj(f, g)
    return teacher, data


TINY_PAIRS = {"train": 200, "validation": 40}


def tiny_translation(work: Path, task: Task, pair: str | None) -> tuple[Path, Path]:
    """Generated pairs and a small translator trained on them, as recipes/dq-bart-translation.sh makes its teacher
    (recipes/translation_teacher.py's Marian shape, here 2+2 layers of d 64, then `distill --student`; 60 steps, so
    that it writes short translations that end, as a trained teacher does, where a random one writes 128 tokens).
    The pairs: the bundled sample's synopses as sources, the same words in reverse order as targets (a made-up
    language: the smoke run checks the plumbing, not what training buys)."""
    from modelshrink.steps.distill import DistillOptions, distill

    teacher, data = work / "teacher", work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for split, count in TINY_PAIRS.items():
        if task.split(data, split, pair).is_file():  # written once: a rerun resumes on the same bytes
            continue
        rows = []
        with open(SAMPLE / f"{split}.jsonl") as f:
            for line in f:
                row = json.loads(line)
                rows.append({"id": row["id"], "source": row["summary"],
                             "target": " ".join(reversed(row["summary"].split()))})
                if len(rows) == count:
                    break
        with gzip.open(task.split(data, split, pair), "wt") as g:
            g.write("".join(json.dumps(row) + "\n" for row in rows))
    if not (teacher / "modelshrink.json").is_file():
        if not (work / "teacher-init" / "config.json").is_file():
            build_translator(work / "teacher-init", task.split(data, "train", pair))
        distill(DistillOptions(data=str(task.split(data, "train", pair)), student=str(work / "teacher-init"),
                               max_steps=60, lr=3e-3, warmup_steps=5, batch_size=32, seed=0), teacher, resume=True)
    return teacher, data


def build_translator(folder: Path, train: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    with gzip.open(train, "rt") as f:
        texts = [text for line in f for text in json.loads(line).values()]
    specials = ["<pad>", "</s>", "<unk>"]  # Marian's ids: pad 0 (also the decoder start), eos 1
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", bpe.token_to_id("</s>"))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                        model_max_length=256)
    torch.manual_seed(0)
    config = MarianConfig(vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=64, encoder_layers=2,
                          decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                          decoder_ffn_dim=128, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0, forced_eos_token_id=1, share_encoder_decoder_embeddings=True,
                          scale_embedding=True)
    model = MarianMTModel(config).eval()
    generation = model.generation_config
    generation.num_beams, generation.max_length, generation.bad_words_ids = 4, 128, None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@dataclass(frozen=True)
class Task:
    name: str
    metrics: tuple[str, ...]  # the table's quality columns, as `eval` names them (modelshrink.metrics.names)
    main: str  # what the verdicts, the figure, the p column, the budget test and the check of exports read
    short: str  # the main metric in a column heading: "p vs teacher (R-L)"
    within: str  # the verdicts' quality bar, in words (the bar itself: frontier.TOLERANCE)
    text: str  # the data's source column
    rows: str  # what one row of the data is, in the report
    generation: dict  # the search of every form, in `eval` and in the timings
    max_source: int
    max_target: int
    search: str  # the search and lengths, for the report's first line
    scoring: str  # how quality is scored and tested, for the report's first line
    data: Path  # --data's default
    files: str  # a split's file in --data
    teacher: str  # --teacher's default
    work: Path  # --work's default: a folder of each task's own, so no artifact of one is resumed as the other's
    recipe: str  # what makes that teacher
    # --trim-vocab: the student keeps only its training data's tokens (summarization: 19,792 of MiniLM's 30,522;
    # translation's 8,000-token BPE was trained on these pairs and keeps 7,659, so it is left whole)
    defaults: dict  # of --student-steps, --quantize-steps, --max-tokens, --budget-bits, --uniform (summarization's
    # 2-8-8: its two word-embedding tables are nearly half its weights, so W=2 E=8 is where uniform bits put the
    # bytes against what sensitivity says; translation's one 8,000-row table is a sixth of its teacher; 3-3-8, the
    # issue's row, last: its 3-bit codes are stored in 4 bits, so it is 4-4-8's size, and 4-4-8's equal budget
    # comes first)
    student_lr: float
    fewer_steps: int  # the fewer-decoder-layer quantize form trains this many times --quantize-steps
    section: str  # its BENCHMARKS.md markers
    title: str
    figure: Path
    tiny: Callable[[Path, Task, str | None], tuple[Path, Path]]  # (work, task, pair) -> (teacher, data folder)
    pair: str | None = None  # --pair's default: the language pair of --data's files
    # the forms of every layer first, their budgets (10x, 13x) right after 2-2-8, then the fewer-layer ones
    # (frontier.made_in_order): translation's target is size and BLEU alone, and in REPRODUCTION's Table 2 half the
    # decoder cost 1.35 (8-8-8) and 2.78 (2-2-8) BLEU; summarization's >= 5x batch-1 form needs fewer layers
    budgets_first: bool = False
    reuse: str = "recipes/dq-bart-debian.sh's folder"  # for --reuse's help

    def label(self, metric: str) -> str:
        return RESULT_METRICS[metric][1]

    def split(self, data: str | Path, split: str, pair: str | None) -> Path:
        return Path(data) / self.files.format(split=split, pair=pair)


TASKS = {
    "summarization": Task(
        name="summarization", metrics=("rouge1", "rouge2", "rougeL"), main="rougeL", short="R-L",
        within="ROUGE-L within 1.0", text="document", rows="documents",
        generation=dict(num_beams=4, max_length=32, no_repeat_ngram_size=3), max_source=128, max_target=32,
        search="beam 4, no repeated trigram, sources ≤ 128 tokens",
        scoring="ROUGE 95% intervals by bootstrap, p: paired permutation test against the teacher",
        data=SHARED / "debian-descriptions", files="{split}.jsonl.gz", teacher="runs/repro/teacher",
        work=Path("runs/frontier"), recipe="recipes/teacher-debian.sh",
        defaults=dict(student_steps=1500, quantize_steps=300, max_tokens=3072, budget_bits="8-8-8,positions=8",
                      uniform=["2-8-8", "4-4-8", "3-3-8"], trim_vocab=True),
        student_lr=3e-4, fewer_steps=1, section="frontier", title="frontier: what the whole chain buys",
        figure=ROOT / "benchmarks" / "frontier.png", tiny=tiny_summarization),
    "translation": Task(
        name="translation", metrics=("bleu", "chrf"), main="bleu", short="BLEU",
        within="translations within 1.0 BLEU", text="source", rows="pairs",
        generation=dict(num_beams=4, max_length=128), max_source=128, max_target=128,
        search="beam 4, translations and sources ≤ 128 tokens",
        scoring="sacreBLEU's BLEU (95% interval by bootstrap over sentences) and chrF, p: paired permutation test "
                "(approximate randomization of the sentences' statistics) against the teacher on BLEU",
        data=SHARED / "debian-translations", files="{pair}.{split}.jsonl.gz", teacher="runs/repro-mt/teacher",
        work=Path("runs/frontier-translation"), recipe="STAGES=teacher bash recipes/dq-bart-translation.sh",
        defaults=dict(student_steps=1200, quantize_steps=600, max_tokens=4096, budget_bits="8-8-8",  # sinusoids
                      uniform=["4-4-8", "3-3-8"], trim_vocab=False),
        student_lr=1e-4, fewer_steps=2,
        section="frontier-translation", title="frontier: what the whole chain buys, translation (issue 55)",
        figure=ROOT / "benchmarks" / "frontier-translation.png", tiny=tiny_translation, pair="en-de", budgets_first=True,
        reuse="recipes/dq-bart-translation.sh's OUT/dq-bart"),
}
