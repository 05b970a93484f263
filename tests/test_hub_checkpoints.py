"""The Hub checkpoints users bring (tests/hub_kits.py: their real configs, generation configs and tokenizers, shrunk,
random weights) through every step that applies, with the parity checks each family has: labels by the static
search equal to `generate`'s, exports equal to PyTorch. Summarizers and the translator: pseudolabel (with the
checkpoint's own generation defaults) -> distill -> quantize 2-2-8 and under a size budget -> export (float, int8,
int4, the quantized artifact) -> the runtime -> eval. Classifiers: contrastive (fine-tuning the pretrained encoder,
then a student) -> quantize -> export -> the runtime -> eval."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import read_rows, write_jsonl
from hub_kits import CHECKPOINTS, KITS, build_kit

pytestmark = pytest.mark.skipif(not CHECKPOINTS.is_dir(), reason="../shared/checkpoints is absent")

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "modelshrink" / "samples" / "debian" / "train.jsonl"
PAIRS = CHECKPOINTS.parent / "data" / "debian-translations" / "en-de.validation.jsonl.gz"
SEQ2SEQ = sorted(name for name, kind in KITS.items() if kind != "classifier")
CLASSIFIERS = sorted(name for name, kind in KITS.items() if kind == "classifier")
GENERATION = ("num_beams", "min_length", "max_length", "length_penalty", "no_repeat_ngram_size")


def _data(kind: str, folder: Path, count: int = 2) -> Path:
    """The bundled Debian sample's first documents, or (a translator) English -> German pairs."""
    if kind == "translator":
        if not PAIRS.is_file():
            pytest.skip("../shared/data is absent")
        with gzip.open(PAIRS, "rt", encoding="utf-8") as f:
            rows = [json.loads(next(f)) for _ in range(count)]
    else:
        rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()[:count]]
    return write_jsonl(folder / "data.jsonl", rows)


def _shorter_searches(model: Path, max_length: int = 24) -> None:
    """The student's generation config with shorter lengths: the labels were written with the checkpoint's own
    (bart-large-cnn's 56-142 tokens, M2M100's 200), and every later search (quantize's validation, the export's
    checks, the runtime, eval) reads the student's; the checks are the same at 24 tokens, in a fraction of the
    time."""
    path = model / "generation_config.json"
    generation = json.loads(path.read_text())
    generation.update(max_length=max_length, min_length=min(generation.get("min_length", 0), max_length // 3))
    path.write_text(json.dumps(generation, indent=2))


def _prefixed_generate(teacher: Path, documents: list[str], prefix: str, max_length: int) -> list[str]:
    """What transformers' own generate writes for the documents behind `prefix`, with the model's generation
    config (and the labels' `max_length`: where the config sets none, transformers 5 takes 21, modelshrink 20)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(teacher).eval()
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    out = []
    for document in documents:
        enc = tokenizer(prefix + document, return_tensors="pt", truncation=True, max_length=512)
        with torch.inference_mode():
            ids = model.generate(**enc, max_length=max_length)[0]
            out.append(tokenizer.decode(ids, skip_special_tokens=True).strip())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", SEQ2SEQ)
def test_a_hub_seq2seq_checkpoint_goes_through_the_chain(name, tmp_path):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from modelshrink import runtime
    from modelshrink.artifacts import read_manifest
    from modelshrink.runtime.inputs import model_prefix
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.evaluate import EvalOptions, evaluate
    from modelshrink.steps.export import ExportOptions, export_model
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    kind = KITS[name]
    teacher = build_kit(name, tmp_path / "teacher")
    data = _data(kind, tmp_path)
    languages = {"target_lang": "de"} if kind == "translator" else {}
    prefix = model_prefix(AutoConfig.from_pretrained(teacher))

    # labels with the checkpoint's own generation defaults; the static search writes generate's
    labels = pseudolabel(PseudolabelOptions(teacher=str(teacher), data=str(data), device="cpu", generator="static",
                                            **languages), tmp_path / "labels")
    plain = pseudolabel(PseudolabelOptions(teacher=str(teacher), data=str(data), device="cpu", limit=1,
                                           generator="transformers", **languages), tmp_path / "labels-generate")
    summaries = [r["summary"] for r in read_rows(labels)]
    assert summaries[:1] == [r["summary"] for r in read_rows(plain)]
    resolved = read_manifest(labels)["resolved"]
    own = GenerationConfig.from_pretrained(teacher).to_diff_dict()
    assert {k: resolved["generation"][k] for k in GENERATION if k in own} == {k: own[k] for k in GENERATION if k in own}
    assert resolved["prefix"] == prefix
    if "t5" in name:  # T5 reads "summarize: " in front of each document, as transformers' pipeline gave it
        assert prefix == "summarize: "
        documents = [r["document"] for r in read_rows(labels)]
        assert summaries == _prefixed_generate(teacher, documents, prefix, resolved["generation"]["max_length"])

    student = distill(DistillOptions(data=str(labels), teacher=str(teacher), decoder_layers=1, max_steps=1,
                                     batch_size=2, device="cpu"), tmp_path / "student")
    assert model_prefix(AutoConfig.from_pretrained(student)) == prefix
    _shorter_searches(student)
    if kind == "translator":  # the labels' languages, carried: the student writes German, reads English
        tokenizer = AutoTokenizer.from_pretrained(student)
        assert GenerationConfig.from_pretrained(student).forced_bos_token_id == tokenizer.convert_tokens_to_ids("__de__")
        assert (tokenizer.src_lang, tokenizer.tgt_lang) == ("en", "de")

    quantized = quantize(QuantizeOptions(model=str(student), bits="2-2-8", data=str(labels), max_steps=1,
                                         batch_size=2, device="cpu"), tmp_path / "2-2-8")
    budget_mb = round(sum(p.stat().st_size for p in student.glob("*.safetensors")) / 1e6 / 5, 3)
    within = quantize(QuantizeOptions(model=str(student), method="direct", budget_mb=budget_mb, data=str(labels),
                                      calibration_examples=2, batch_size=2, device="cpu"), tmp_path / "budget")
    assert read_manifest(within)["metrics"]["bit_plan"]["written_bytes"] <= budget_mb * 1e6
    assert model_prefix(AutoConfig.from_pretrained(quantized)) == prefix

    forms = {"float": (student, {}), "int8": (student, {"int8": True}), "int4": (student, {"int4": True}),
             "2-2-8": (quantized, {})}
    for form, (model, options) in forms.items():
        # float graphs write PyTorch's tokens; the others are checked output by output (their tokens may differ)
        folder, report = export_model(ExportOptions(model=str(model), data=str(data), samples=2,
                                                    generation_docs=2 if form == "float" else 0, **options),
                                      tmp_path / f"onnx-{form}")
        if form == "float":
            assert report["validation"]["generation"]["equal"], report["validation"]["generation"]
            exported = folder
    served = runtime.load(exported)
    assert served.prefix == prefix
    documents = [r["source" if kind == "translator" else "document"] for r in read_rows(data.parent)]
    assert len(served.summarize(documents, batch_size=2)) == len(documents)

    _, metrics = evaluate(EvalOptions(model=str(exported), data=str(data), latency_docs=0, resamples=100,
                                      allow_empty=True), tmp_path / "eval")
    assert metrics["task"] == ("translation" if kind == "translator" else "summarization")
    assert metrics["documents"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_hub_classifier_checkpoint_goes_through_the_chain(name, tmp_path):
    from modelshrink import runtime
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive
    from modelshrink.steps.evaluate import EvalOptions, evaluate
    from modelshrink.steps.export import ExportOptions, export_model
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    encoder = build_kit(name, tmp_path / "encoder")
    sentences = [("a tender and moving film", 1), ("dull, lifeless and far too long", 0),
                 ("the best comedy of the year", 1), ("a mess of a script", 0)] * 2
    data = write_jsonl(tmp_path / "data.jsonl", [{"sentence": s, "label": y} for s, y in sentences])
    teacher = contrastive(ContrastiveOptions(data=str(data), student=str(encoder), max_steps=2, batch_size=4,
                                             device="cpu"), tmp_path / "teacher")
    student = contrastive(ContrastiveOptions(data=str(data), teacher=str(teacher), layers=2, max_steps=2,
                                             batch_size=4, device="cpu"), tmp_path / "student")
    quantized = quantize(QuantizeOptions(model=str(student), teacher=str(teacher), bits="2-2-8", data=str(data),
                                         max_steps=1, batch_size=4, device="cpu"), tmp_path / "2-2-8")
    for form, (model, options) in {"float": (student, {}), "int8": (student, {"int8": True}),
                                   "2-2-8": (quantized, {})}.items():
        folder, report = export_model(ExportOptions(model=str(model), data=str(data), samples=4, **options),
                                      tmp_path / f"onnx-{form}")
        if form == "float":
            assert report["validation"]["predictions"]["equal"], report["validation"]["predictions"]
            exported = folder
    assert len(runtime.load(exported).classify([s for s, _ in sentences])) == len(sentences)
    _, metrics = evaluate(EvalOptions(model=str(exported), data=str(data), latency_docs=0, resamples=100),
                          tmp_path / "eval")
    assert metrics["task"] == "classification" and metrics["documents"] == len(sentences)


@pytest.fixture(scope="module")
def kits(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kits")
    return {name: build_kit(name, root / name) for name in ("facebook--bart-large-cnn", "facebook--m2m100_418M",
                                                            "google-t5--t5-small")}


def test_bart_large_cnns_mask_past_the_embedding_is_read_as_text_and_a_real_misfit_is_refused(kits, tmp_path):
    """The Hub's one-off: 50,265 tokens for 50,264 rows. `<mask>` is special, named by no config field, and never
    scored: the model loads, and a literal "<mask>" in a document tokenizes to ordinary pieces, in PyTorch and in
    an export's tokenizer.json alike. A tokenizer whose ordinary words run past the embedding is refused in one
    line naming its files."""
    import json as _json

    from tokenizers import Tokenizer
    from transformers import AutoConfig

    from modelshrink.errors import UserError
    from modelshrink.models.loading import resolve

    tokenizer = resolve(str(kits["facebook--bart-large-cnn"]), "teacher").tokenizer()
    assert len(tokenizer) == 50265 and AutoConfig.from_pretrained(kits["facebook--bart-large-cnn"]).vocab_size == 50264
    assert max(tokenizer("a <mask> in the text")["input_ids"]) < 50264
    tokenizer.save_pretrained(tmp_path / "saved")
    assert max(Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode("a <mask>").ids) < 50264

    small = tmp_path / "small"  # the same files, an embedding 100 rows short: ordinary BPE tokens past it
    small.mkdir()
    for path in kits["facebook--bart-large-cnn"].iterdir():
        (small / path.name).write_bytes(path.read_bytes())
    config = _json.loads((small / "config.json").read_text())
    config["vocab_size"] = 50165
    (small / "config.json").write_text(_json.dumps(config))
    with pytest.raises(UserError, match=r"does not fit the model \(50265 tokens, the model's vocabulary 50165; "
                                        r"past it: .*tokenizer files \(merges.txt, tokenizer.json, vocab.json\)"):
        resolve(str(small), "teacher").tokenizer()


def test_m2m100s_target_language_is_its_code_token_and_labels_without_one_are_refused_in_one_line(kits, tmp_path):
    """--target-lang de forces `__de__` (M2M100's tokenizer also lists its languages by name, and "de" is an
    ordinary word of its vocabulary); a student trained on pairs with no language anywhere is refused in one line
    naming --target-lang, never a KeyError from inside the tokenizer."""
    from transformers import AutoModelForSeq2SeqLM

    from modelshrink.errors import UserError
    from modelshrink.languages import target_language
    from modelshrink.models.loading import load_tokenizer
    from modelshrink.steps.distill import DistillOptions, distill

    teacher = kits["facebook--m2m100_418M"]
    tokenizer = load_tokenizer(str(teacher), "teacher")
    model = AutoModelForSeq2SeqLM.from_pretrained(teacher)
    assert target_language(model, tokenizer, "de", "teacher") == "__de__"
    assert model.generation_config.forced_bos_token_id == tokenizer.convert_tokens_to_ids("__de__") == 128020
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"source": "a free library", "target": "eine freie Bibliothek"}] * 2)
    with pytest.raises(UserError, match="translates into 100 languages and its generation config names none: pass "
                                        "--target-lang"):
        distill(DistillOptions(data=str(pairs), teacher=str(teacher), decoder_layers=1, max_steps=1, batch_size=2,
                               device="cpu"), tmp_path / "student")


def test_a_missing_tokenizer_package_is_named_in_one_line(kits, tmp_path):
    """M2M100's tokenizer without the sentencepiece package (blocked in a fresh interpreter: transformers caches
    what it found installed): one line naming the package, no traceback."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['sentencepiece'] = None\n"
            f"sys.argv = ['modelshrink', 'pseudolabel', {str(kits['facebook--m2m100_418M'])!r}, {str(SAMPLE)!r}, '-o', 'out']\n"
            "from modelshrink.cli import main\nmain()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "its tokenizer needs the sentencepiece package, which is not installed: pip install sentencepiece" in \
        done.stderr.replace("\n", " ")


def test_m2m100s_tokenizer_json_writes_transformers_ids(kits):
    """The tokenizer.json an export writes for M2M100's Python-only tokenizer gives transformers' ids for its
    sources (pieces its vocab.json lacks read as <unk> by the runtime), and its text back."""
    from transformers import AutoTokenizer

    from modelshrink.models.fast_tokenizers import m2m100_fast

    slow = AutoTokenizer.from_pretrained(kits["facebook--m2m100_418M"])
    fast = m2m100_fast(slow, 128112)
    texts = ["  Two  spaces, a tab\there and\na newline ", "ｆｕｌｌ width ① émigré naïve 日本語のテキスト",
             "a __de__ code and </s> in the text", "Documentation: http://quitte.de/dsp/caps.html", ""]
    if PAIRS.is_file():
        with gzip.open(PAIRS, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)[side] for line, _ in zip(f, range(300)) for side in ("source", "target")]
    unk = slow.unk_token_id
    for text in texts:
        assert [unk if i >= 128112 else i for i in fast.encode(text).ids] == slow(text)["input_ids"], text
        ids = slow(text)["input_ids"]
        assert fast.decode(ids, skip_special_tokens=True) == slow.decode(ids, skip_special_tokens=True), text


def test_t5s_prefix_is_read_from_its_config_and_prefix_overrides_it(kits, tmp_path):
    """T5's labels are written behind "summarize: " (its config's summarization prefix) and the manifest says so;
    --prefix "" switches it off (the labels are then generate's without it)."""
    from modelshrink.artifacts import read_manifest
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    teacher = kits["google-t5--t5-small"]
    data = _data("summarizer", tmp_path)
    runs = {prefix: pseudolabel(PseudolabelOptions(teacher=str(teacher), data=str(data), device="cpu", prefix=prefix),
                                tmp_path / f"labels-{prefix is None}") for prefix in (None, "")}
    assert read_manifest(runs[None])["resolved"]["prefix"] == "summarize: "
    assert read_manifest(runs[""])["resolved"]["prefix"] == ""
    documents = [r["document"] for r in read_rows(runs[""])]
    assert [r["summary"] for r in read_rows(runs[""])] == _prefixed_generate(teacher, documents, "", 20)
