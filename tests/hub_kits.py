"""The Hub checkpoints users bring, as kits: each one's real config, generation config and tokenizer files from
`../shared/checkpoints` (no weights), its layers and width shrunk, random weights. Everything else is the real
checkpoint's: model type, vocabulary and its quirks (bart-large-cnn's `<mask>` past the embedding, T5's 28 unused
rows), special tokens, positions, embedding scale, norms, generation defaults, task prefixes.

A new kit in ../shared/checkpoints is one line of `KITS`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CHECKPOINTS = Path(__file__).resolve().parents[1].parent / "shared" / "checkpoints"

# folder in ../shared/checkpoints -> what the chain does with it: "summarizer", "translator" (a many-to-many one,
# labelled into German) or "classifier" (an encoder, fine-tuned by `contrastive` first)
KITS = {
    "facebook--bart-large-cnn": "summarizer",
    "sshleifer--distilbart-cnn-12-6": "summarizer",
    "google--pegasus-xsum": "summarizer",
    "google-t5--t5-small": "summarizer",
    "google--flan-t5-base": "summarizer",
    "facebook--m2m100_418M": "translator",
    "google-bert--bert-base-uncased": "classifier",
    "sentence-transformers--all-MiniLM-L6-v2": "classifier",
}

# the sizes a kit is shrunk to, for whichever of these names its config has (BART/M2M100/Pegasus, T5, BERT)
SHRUNK = {"d_model": 32, "hidden_size": 32, "d_kv": 8, "d_ff": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
          "intermediate_size": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "num_heads": 4,
          "num_attention_heads": 4, "encoder_layers": 2, "decoder_layers": 2, "num_layers": 2,
          "num_decoder_layers": 2, "num_hidden_layers": 3}
# weights drawn wider than the library's initialisation (as conftest's `build`), for whichever of these names the
# config has: a random model's next-token scores are then far apart, so that batching or a graph's other order of
# sums cannot flip a near tie, and searches that must agree do (the saved config keeps its own values)
WIDE = {"init_std": 0.3, "initializer_range": 0.3}  # (T5 kept: its float export stays within 1e-4 of PyTorch)


def shrunk_config(name: str):
    """The kit's real config with its layers and width shrunk (`SHRUNK`); nothing else changed."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(CHECKPOINTS / name)
    present = config.to_dict()
    for key, value in SHRUNK.items():
        if key in present and not (key == "num_hidden_layers" and config.is_encoder_decoder):
            setattr(config, key, value)
    return config


def build_kit(name: str, folder: Path, seed: int = 0, max_length: int | None = None) -> Path:
    """The kit `name` as a model folder: its shrunk config, random weights (of its own architecture: a classifier
    kit is the pretrained encoder users fine-tune, BertForMaskedLM or BertModel), and its own generation config and
    tokenizer files copied beside them. `max_length`: the generation config's lengths cut to it (a test that runs
    commands as written, whose every search would otherwise write bart-large-cnn's 142 or M2M100's 200 tokens)."""
    import torch
    import transformers

    config = shrunk_config(name)
    own = {key: getattr(config, key) for key in WIDE if key in config.to_dict()}
    for key in own:
        setattr(config, key, WIDE[key])
    torch.manual_seed(seed)
    if config.is_encoder_decoder:
        model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    else:
        model = getattr(transformers, (config.architectures or ["BertModel"])[0])(config)
    for key, value in own.items():
        setattr(model.config, key, value)
    model.save_pretrained(folder)
    for path in (CHECKPOINTS / name).iterdir():
        if path.name == "config.json":
            continue
        if path.is_dir():
            shutil.copytree(path, folder / path.name, dirs_exist_ok=True)
        else:
            shutil.copy(path, folder / path.name)
    if max_length is not None and (folder / "generation_config.json").is_file():
        generation = json.loads((folder / "generation_config.json").read_text())
        for key in ("max_length", "min_length"):
            generation[key] = min(generation.get(key, max_length), max_length // (1 if key == "max_length" else 2))
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return folder
