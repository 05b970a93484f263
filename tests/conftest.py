"""Tiny models of every family, built from configs, with tokenizers trained here: fast and offline."""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_configure(config):
    """Under pytest-xdist (`-n 2`) each worker runs torch on one thread, and so do the processes its tests start:
    two workers of two threads each on 2 cores would fight over them (torch's threads spin while they wait)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "a small library for parsing json files in python with streaming support",
    "this package provides the command line tools for managing virtual machines",
    "documentation for the networking library including examples and api reference",
    "fast image viewer with support for many formats and a simple keyboard interface",
    "the server stores data in memory and writes snapshots to disk at regular intervals",
    "plugin that adds spell checking to the text editor using several dictionaries",
    "development files for the compression library headers and static archives",
    "a game where players build cities trade goods and defend against invaders",
    "utilities to convert audio files between formats while keeping metadata",
    "the daemon watches folders and runs commands when files change",
    "fonts designed for programming with clear shapes for similar characters",
]
SUMMARIES = [
    "fox jumps over dog", "json parsing library", "virtual machine tools", "networking library docs",
    "fast image viewer", "in memory data server", "spell checking plugin", "compression library headers",
    "city building game", "audio file converter", "folder watching daemon", "programming fonts",
]


def _word_tokenizer(specials: list[str], template: str, **special_map):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token=special_map["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(DOCUMENTS + SUMMARIES, trainers.WordLevelTrainer(special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(s, tok.token_to_id(s)) for s in specials if s in template])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=64, **special_map)
    return fast


def bart_tokenizer():
    return _word_tokenizer(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s> $A </s>", bos_token="<s>",
                           pad_token="<pad>", eos_token="</s>", unk_token="<unk>", mask_token="<mask>")


def t5_tokenizer():
    return _word_tokenizer(["<pad>", "</s>", "<unk>"], "$A </s>", pad_token="<pad>", eos_token="</s>",
                           unk_token="<unk>")


def bert_tokenizer():
    return _word_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS] $A [SEP]", pad_token="[PAD]",
                           unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def build(family: str, attn_implementation: str = "sdpa", seed: int = 0, wide: bool = True):
    """(model, tokenizer) of a tiny random model. With `wide` (default) weights are initialised wider
    than usual so that attention is peaked and a temperature change moves the outputs visibly;
    `wide=False` keeps the library's usual initialisation, which trains faster."""
    from transformers import (BartConfig, BartForConditionalGeneration, BertConfig, EncoderDecoderConfig,
                              EncoderDecoderModel, T5Config, T5ForConditionalGeneration)

    torch.manual_seed(seed)
    if family == "bart":
        tok = bart_tokenizer()
        config = BartConfig(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                            decoder_ffn_dim=64, max_position_embeddings=80, init_std=0.3,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id, decoder_start_token_id=tok.eos_token_id,
                            forced_eos_token_id=None, attn_implementation=attn_implementation)
        model = BartForConditionalGeneration(config)
    elif family == "t5":
        tok = t5_tokenizer()
        config = T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          initializer_factor=3.0 if wide else 1.0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          decoder_start_token_id=tok.pad_token_id, attn_implementation=attn_implementation)
        model = T5ForConditionalGeneration(config)
    elif family == "bert2bert":
        tok = bert_tokenizer()
        common = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=80,
                      initializer_range=0.3 if wide else 0.02)
        config = EncoderDecoderConfig.from_encoder_decoder_configs(
            BertConfig(**common), BertConfig(**common, is_decoder=True, add_cross_attention=True))
        config.decoder_start_token_id = tok.cls_token_id
        config.eos_token_id = tok.sep_token_id
        config.pad_token_id = tok.pad_token_id
        model = EncoderDecoderModel(config)
        model.config._attn_implementation = attn_implementation
        model.encoder.config._attn_implementation = attn_implementation
        model.decoder.config._attn_implementation = attn_implementation
    else:
        raise ValueError(family)
    with torch.no_grad():  # non-zero biases, so that scaling a query bias is visible too
        for name, param in model.named_parameters() if wide else []:
            if name.endswith(".bias") and "norm" not in name.lower():
                param.normal_(0.0, 0.2)
    gc = model.generation_config
    gc.decoder_start_token_id = model.config.decoder_start_token_id
    gc.eos_token_id = tok.eos_token_id if family != "bert2bert" else tok.sep_token_id
    gc.pad_token_id = tok.pad_token_id
    gc.bos_token_id = None if family != "bert2bert" else tok.cls_token_id
    gc.num_beams, gc.max_length, gc.min_length, gc.no_repeat_ngram_size = 2, 10, 0, 0
    gc.forced_eos_token_id = None
    model.eval()
    return model, tok


FAMILIES = ["bart", "t5", "bert2bert"]


# the translation families: (config class, model class, forces a target-language code first)
TRANSLATORS = {"marian": ("MarianConfig", "MarianMTModel", False),
               "mbart": ("MBartConfig", "MBartForConditionalGeneration", True),
               "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration", True)}


def translator(family: str, folder: Path) -> Path:
    """A tiny random translator of `family` (TRANSLATORS) saved with its tokenizer; mBART and M2M100 force a
    stand-in target-language code as their first token."""
    import transformers

    config_class, model_class, language_code = TRANSLATORS[family]
    tok = bart_tokenizer()
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=80,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        # Marian starts from the pad token; mBART and M2M100 from EOS, then the forced language code
        decoder_start_token_id=tok.pad_token_id if family == "marian" else tok.eos_token_id, forced_eos_token_id=None)
    model = getattr(transformers, model_class)(config)
    model.generation_config.num_beams, model.generation_config.max_length = 2, 10
    if language_code:  # a word of the test vocabulary stands in for the code ("de_DE", "__de__")
        model.generation_config.forced_bos_token_id = tok.convert_tokens_to_ids("data")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _save_families(root: Path, wide: bool) -> dict[str, Path]:
    paths = {}
    for family in FAMILIES:
        model, tok = build(family, wide=wide)
        model.save_pretrained(root / family)
        tok.save_pretrained(root / family)
        paths[family] = root / family
    return paths


@pytest.fixture(scope="session")
def saved_models(tmp_path_factory) -> dict[str, Path]:
    """Each family's tiny model saved with save_pretrained (what a user points modelshrink at)."""
    return _save_families(tmp_path_factory.mktemp("models"), wide=True)


@pytest.fixture(scope="session")
def plain_models(tmp_path_factory) -> dict[str, Path]:
    """The same tiny models with the library's usual initialisation (the wide test init pushes T5's activations
    to where float32 rounding alone nears export's 1e-4 tolerance)."""
    return _save_families(tmp_path_factory.mktemp("plain"), wide=False)


def save_classifier(path: Path, tok, hidden: int = 16, layers: int = 1) -> Path:
    """A tiny BERT sequence classifier over `tok`, saved with its tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                                                     num_attention_heads=2, intermediate_size=2 * hidden))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def classifier_path(tmp_path_factory) -> Path:
    """A tiny BERT sequence classifier: not an encoder-decoder."""
    return save_classifier(tmp_path_factory.mktemp("classifier") / "bert-classifier", bert_tokenizer())


def free_port() -> int:
    """A TCP port nobody listens on now: each multi-process launch gets its own, so launches in parallel test
    workers (pytest -n 2) do not meet on accelerate's and torchrun's default 29500."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(processes: int, *args) -> list[str]:
    """`accelerate launch` of `python -m modelshrink ARGS` on `processes` gloo processes, on a free port."""
    import sys

    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
            str(free_port()), "-m", "modelshrink", *map(str, args)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture
def docs_jsonl(tmp_path) -> Path:
    rows = [{"id": f"doc-{i}", "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    return write_jsonl(tmp_path / "docs.jsonl", rows)


def read_rows(artifact: Path) -> list[dict]:
    return [json.loads(line) for line in (artifact / "data.jsonl").read_text().splitlines()]


def graph_nodes(graph) -> list:
    """An ONNX graph's nodes and those of its If branches (the merged decoder)."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        nodes += [n for a in node.attribute if a.g.node for n in graph_nodes(a.g)]
    return nodes


# ---------------------------------------------------------------- trackers (--report-to)

def train_log_lines(folder):
    return [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()]


def train_log_scalars(log):
    """{tag: {step: value}} of every scalar train_log.jsonl holds, as the trackers should have it."""
    from modelshrink.training.tracking import scalars

    out: dict[str, dict[int, float]] = {}
    for entry in log:
        for tag, value in scalars(entry).items():
            out.setdefault(tag, {})[entry["step"]] = value
    return out


def tensorboard_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_same_scalars(got, expected):
    assert sorted(got) == sorted(expected)
    for tag, values in expected.items():
        assert sorted(got[tag]) == sorted(values), tag
        for step, value in values.items():
            assert math.isclose(got[tag][step], value, rel_tol=1e-6, abs_tol=1e-9), (tag, step, got[tag][step], value)


@contextmanager
def one_torch_thread():
    """Torch on one thread inside, as in launched or killed workers (OMP_NUM_THREADS=1): results made here while
    they run do not fight them over the cores, and float operations match theirs bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def interrupt_after(n_calls: int):
    """A progress callback that interrupts the run (Ctrl-C) on its call after the first `n_calls`."""
    calls = {"n": 0}

    def progress(done, total):
        calls["n"] += 1
        if calls["n"] > n_calls:
            raise KeyboardInterrupt

    return progress
