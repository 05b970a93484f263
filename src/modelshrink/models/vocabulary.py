"""A model's vocabulary trimmed to the tokens a corpus uses (`distill --trim-vocab`, `contrastive --trim-vocab`).

A pretrained vocabulary is larger than any one task needs: MiniLM's 30,522 WordPiece rows, of which the 46k
Debian descriptions and their synopses use 17,982; BART's 50,265; mBART's 250,027 for 50 languages. Each row is
stored in the encoder's table, again in the decoder's (bert2bert) and scored by the LM head at every decoding
step, the largest single matrix a small decoder multiplies. Trimming keeps:

- every token the corpus tokenizes to (documents and summaries, untruncated),
- every special and added token, and every id the config or generation config names (pad, EOS, decoder start,
  forced language codes),
- what keeps any text tokenizable: every single character (WordPiece: with and without its `##` prefix;
  byte-level BPE: its 256-symbol alphabet, Unigram: its one-character pieces) and, for BPE, every token a kept
  token is merged from.

The model keeps those rows (input tables, LM head, its bias) renumbered in their old order, and the tokenizer
is rewritten to match (its `tokenizer.json`: vocabulary, merges, added tokens, post-processor ids). Model and
tokenizer stay a plain `save_pretrained` pair that needs no id map. A text of the corpus tokenizes to the same
tokens as before (WordPiece's longest match, BPE's lowest-rank merge and Unigram's most likely split choose among
the kept tokens what they chose before, since what they chose is kept); another may be split into more pieces
where a piece it used is gone. The kept model's logits are the old model's logits at the kept ids, exactly
(tested for every family).

`teacher_ids` maps a trimmed student's ids to its teacher's by token, so that word-level losses still compare
the two (the teacher reads the same text in its own ids, and its logits are taken at the student's tokens);
`TeacherInOwnIds` is a classifier teacher that reads a trimmed student's batches that way.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from modelshrink.errors import UserError

# config and generation-config fields that hold token ids (an int, a list of ints, or None)
ID_FIELDS = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "forced_bos_token_id",
             "forced_eos_token_id", "sep_token_id", "cls_token_id", "unk_token_id", "mask_token_id")
ID_LISTS = ("suppress_tokens", "begin_suppress_tokens")
MODEL_TYPES = ("WordPiece", "WordLevel", "BPE", "Unigram")


def backend(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer's `tokenizer.json` as a dict; a tokenizer without one is refused in one line."""
    fast = getattr(tokenizer, "backend_tokenizer", None)
    if fast is None:
        raise UserError(f"--trim-vocab rewrites a fast tokenizer's tokenizer.json; {type(tokenizer).__name__} has "
                        "none (a sentencepiece-only tokenizer)")
    spec = json.loads(fast.to_str())
    kind = spec["model"]["type"]
    if kind not in MODEL_TYPES:
        raise UserError(f"--trim-vocab knows {', '.join(MODEL_TYPES)} tokenizers, not {kind}")
    if kind == "BPE" and (spec["model"].get("continuing_subword_prefix") or spec["model"].get("end_of_word_suffix")):
        raise UserError("--trim-vocab knows BPE tokenizers without a subword prefix or word suffix (byte-level BPE: "
                        "BART, RoBERTa, GPT-2); this one has "
                        f"{spec['model'].get('continuing_subword_prefix') or spec['model'].get('end_of_word_suffix')!r}")
    return spec


def corpus_ids(tokenizer: Any, texts: Iterable[str], batch: int = 1024) -> set[int]:
    """Every id the texts tokenize to, special tokens included, untruncated (a copy of the backend without the
    truncation and padding its tokenizer.json may set: MiniLM's truncates at 128)."""
    from tokenizers import Tokenizer

    fast = Tokenizer.from_str(json.dumps(backend(tokenizer)))
    fast.no_truncation()
    fast.no_padding()
    used: set[int] = set()
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch:
            used.update(i for e in fast.encode_batch(chunk) for i in e.ids)
            chunk = []
    if chunk:
        used.update(i for e in fast.encode_batch(chunk) for i in e.ids)
    return used


def _merges(model: dict[str, Any]) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in model.get("merges", [])]


def kept_ids(tokenizer: Any, used: set[int], configs: Iterable[Any] = (), multiple: int = 8) -> list[int]:
    """The ids a trimmed vocabulary keeps (sorted): `used` (from `corpus_ids`), the special and added tokens, the
    ids `configs` name, and what keeps any text tokenizable (see the module's docstring); then the first unused
    tokens up to a `multiple` of 8 in all (which changes no kept text's tokens: they are the old tokenizer's too)."""
    spec = backend(tokenizer)
    model = spec["model"]
    vocab: dict[str, int] = tokenizer.get_vocab()
    kept = set(used) | {t["id"] for t in spec.get("added_tokens", [])}
    kept.update(i for i in tokenizer.all_special_ids if i is not None)
    for config in configs:
        for name in ID_FIELDS:
            kept.update(_ids(getattr(config, name, None)))
    kind, merges = model["type"], []
    if kind == "WordPiece":
        prefix = model.get("continuing_subword_prefix") or "##"
        kept.update(i for t, i in vocab.items() if len(t) == 1 or (t.startswith(prefix) and len(t) == len(prefix) + 1))
    elif kind == "Unigram":
        kept.update(i for t, i in vocab.items() if len(t) == 1 or (model.get("byte_fallback") and _is_byte(t)))
    elif kind == "BPE":
        kept.update(i for t, i in vocab.items() if len(t) == 1 or (model.get("byte_fallback") and _is_byte(t)))
        merges = _merges(model)
        _merge_closure(kept, merges, vocab)
    size = len(tokenizer)
    kept = {i for i in kept if 0 <= i < size}
    if multiple > 1 and len(kept) % multiple:  # GPU matmuls want the head's rows a multiple of 8
        ready = ({vocab[a + b] for a, b in merges if a + b in vocab and vocab.get(a) in kept and vocab.get(b) in kept}
                 if kind == "BPE" else set(range(size)))
        extra = [i for i in sorted(ready) if i not in kept]
        kept.update(extra[:multiple - len(kept) % multiple])
    return sorted(kept)


def _merge_closure(kept: set[int], merges: list[tuple[str, str]], vocab: dict[str, int]) -> None:
    """Both parts of every merge whose result is kept, until nothing changes: then every merge a kept text used
    survives (a token it was built through was merged into a kept one), and no dropped merge (its result is not
    kept) can have fired, so BPE's lowest-rank choice is what it was. Parts rank below what they make, so one pass
    from the last merge back does it; the loop only confirms."""
    changed = True
    while changed:
        changed = False
        for a, b in reversed(merges):
            if vocab.get(a + b) in kept:
                for piece in (a, b):
                    if piece in vocab and vocab[piece] not in kept:
                        kept.add(vocab[piece])
                        changed = True


def _is_byte(token: str) -> bool:
    return len(token) == 6 and token.startswith("<0x") and token.endswith(">")


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def trim_tokenizer(tokenizer: Any, kept: list[int], trust_remote_code: bool = False) -> Any:
    """A tokenizer of the kept ids (renumbered 0.. in their old order), loaded as the original's class."""
    from transformers import AutoTokenizer

    spec = backend(tokenizer)
    new = {old: i for i, old in enumerate(kept)}
    model = spec["model"]
    if model["type"] == "Unigram":
        model["vocab"] = [piece for i, piece in enumerate(model["vocab"]) if i in new]
        if model.get("unk_id") is not None:
            model["unk_id"] = new[model["unk_id"]]
    else:
        model["vocab"] = {t: new[i] for t, i in model["vocab"].items() if i in new}
        if model["type"] == "BPE":
            vocab = model["vocab"]
            model["merges"] = [[a, b] for a, b in _merges(model) if a in vocab and b in vocab and a + b in vocab]
    for token in spec.get("added_tokens", []):
        token["id"] = new[token["id"]]
    if spec.get("post_processor"):
        spec["post_processor"] = _renumber(spec["post_processor"], new)
    if spec.get("padding") and spec["padding"].get("pad_id") in new:
        spec["padding"]["pad_id"] = new[spec["padding"]["pad_id"]]
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        Path(folder, "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
        config_file = Path(folder, "tokenizer_config.json")
        config = json.loads(config_file.read_text())
        if "added_tokens_decoder" in config:
            config["added_tokens_decoder"] = {str(new[int(k)]): v for k, v in config["added_tokens_decoder"].items()}
            config_file.write_text(json.dumps(config, ensure_ascii=False, indent=2))
        trimmed = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if len(trimmed) != len(kept):
        raise UserError(f"the trimmed tokenizer has {len(trimmed)} tokens, not the {len(kept)} kept")
    return trimmed


def _renumber(node: Any, new: dict[int, int]) -> Any:
    """A post-processor with its token ids renumbered: TemplateProcessing's `ids`, Bert/RobertaProcessing's
    `[token, id]` pairs, and those inside a Sequence."""
    if isinstance(node, list):
        return [_renumber(n, new) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "ids" and isinstance(value, list):
            out[key] = [new[i] for i in value]
        elif key in ("sep", "cls") and isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
            out[key] = [value[0], new[value[1]]]
        else:
            out[key] = _renumber(value, new)
    return out


def trim_model(model: Any, kept: list[int]) -> None:
    """Keep the rows of `kept` in every table indexed by token (the input tables of encoder and decoder, the LM
    head's weight and bias, BART's constant `final_logits_bias`), in place, ties kept; the configs' vocabulary
    sizes and token ids follow."""
    size = model.get_input_embeddings().num_embeddings
    if getattr(model.config, "share_encoder_decoder_embeddings", True) is False:
        raise UserError("--trim-vocab keeps one vocabulary; this Marian has one per side "
                        "(share_encoder_decoder_embeddings=False)")
    index = torch.tensor(kept, dtype=torch.long)
    new = {old: i for i, old in enumerate(kept)}
    done: set[int] = set()

    def keep_rows(param: torch.nn.Parameter | torch.Tensor, dim: int = 0) -> None:
        if id(param) in done:
            return
        done.add(id(param))
        with torch.no_grad():
            param.data = param.data.index_select(dim, index.to(param.device)).contiguous()

    tables = [model.get_input_embeddings()]
    for side in ("get_encoder", "get_decoder"):
        part = getattr(model, side, lambda: None)()
        if part is not None and hasattr(part, "get_input_embeddings"):
            tables.append(part.get_input_embeddings())
    tables = list({id(t): t for t in tables if t is not None}.values())  # BART's shared table is its stacks' too
    head = model.get_output_embeddings()
    sizes = {t.num_embeddings for t in tables} | ({head.out_features} if head is not None else set())
    if sizes != {size}:  # checked before anything is cut
        raise UserError(f"--trim-vocab keeps one vocabulary; this model's tables and LM head hold "
                        f"{' and '.join(f'{n:,}' for n in sorted(sizes))} tokens (encoder and decoder of other "
                        "vocabularies)")
    for table in tables:
        keep_rows(table.weight)
        table.num_embeddings = len(kept)
        if table.padding_idx is not None:
            table.padding_idx = new.get(table.padding_idx)
    if head is not None:
        keep_rows(head.weight)
        head.out_features = len(kept)
        if head.bias is not None:
            keep_rows(head.bias)
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("final_logits_bias"):
            keep_rows(tensor, dim=tensor.dim() - 1)
        elif name.endswith("predictions.bias"):  # BERT's LM head bias (tied to its linear's)
            keep_rows(tensor)
    for config in _configs(model.config):
        for name in ("vocab_size", "decoder_vocab_size"):
            if getattr(config, name, None) == size:
                setattr(config, name, len(kept))
    for config in _all_configs(model):
        _renumber_config(config, new)


def _configs(config: Any) -> list[Any]:
    return [config] + [c for c in (getattr(config, "encoder", None), getattr(config, "decoder", None))
                       if c is not None and hasattr(c, "to_dict")]


def _all_configs(model: Any) -> list[Any]:
    """The model's configs and its generation config, where it has one (a classifier has none)."""
    generation = getattr(model, "generation_config", None) if model.can_generate() else None
    return _configs(model.config) + ([generation] if generation is not None else [])


def _renumber_config(config: Any, new: dict[int, int]) -> None:
    def renumbered(name: str, value: int) -> int:
        if int(value) not in new:
            raise UserError(f"the config's {name} {value} is not a token of the vocabulary ({len(new):,} kept)")
        return new[int(value)]

    for name in ID_FIELDS:
        value = getattr(config, name, None)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            setattr(config, name, [renumbered(name, v) for v in value])
        else:
            setattr(config, name, renumbered(name, value))
    for name in ID_LISTS:
        value = getattr(config, name, None)
        if value:
            setattr(config, name, [new[int(v)] for v in value if int(v) in new])
    if getattr(config, "bad_words_ids", None):
        config.bad_words_ids = [[new[i] for i in seq] for seq in config.bad_words_ids if all(i in new for i in seq)]


def teacher_ids(teacher_tokenizer: Any, student_tokenizer: Any) -> list[int] | None:
    """teacher id of each student id, by token, where the student's vocabulary is a renumbered subset of the
    teacher's (a trimmed student); None where the two are the same. A student with a token the teacher lacks is
    refused in one line."""
    teacher, student = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher == student:
        return None
    for name in ("pad_token", "eos_token", "bos_token", "unk_token", "cls_token", "sep_token"):
        a, b = (str(getattr(t, name, None)) for t in (teacher_tokenizer, student_tokenizer))
        if a != b:
            raise UserError(f"teacher and student tokenizers differ: {name} {a!r} and {b!r}; word-level losses "
                            "compare token distributions and need the same tokenizer (or one trimmed from it)")
    rules = [_rules(t) for t in (teacher_tokenizer, student_tokenizer)]
    if rules[0] != rules[1]:
        raise UserError("teacher and student tokenizers differ: they split text by other rules (normalizer, "
                        "pre-tokenizer or model); word-level losses need the same tokenizer (or one trimmed from it)")
    missing = [t for t in student if t not in teacher]
    if missing:
        raise UserError(f"teacher and student tokenizers differ: the student has {len(missing)} tokens the teacher "
                        f"lacks (e.g. {missing[0]!r}); word-level losses compare token distributions and need the "
                        "same tokens (or a student trimmed from the teacher's vocabulary)")
    by_id = sorted(student.items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise UserError("the student tokenizer's ids are not 0..N-1")
    return [teacher[t] for t, _ in by_id]


def in_teacher_ids(index: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """A trimmed student's ids (`index`: the teacher's id of each, on their device) in the teacher's; negative ids
    (-100, labels left out of a loss) stay as they are."""
    return torch.where(ids < 0, ids, index[ids.clamp(min=0)])


class TeacherInOwnIds(torch.nn.Module):
    """A frozen teacher called with a trimmed student's batches: their `input_ids` (student ids) become its own
    (`index`, the teacher's id of each student id, a buffer that follows the teacher's device) before it reads
    them. Every other attribute (`config`, `set_attn_implementation`, ...) is the teacher's."""

    def __init__(self, teacher: torch.nn.Module, index: list[int]) -> None:
        super().__init__()
        self.teacher = teacher
        self.register_buffer("index", torch.tensor(index, dtype=torch.long), persistent=False)

    def forward(self, input_ids: torch.Tensor, **inputs: Any) -> Any:
        return self.teacher(input_ids=in_teacher_ids(self.index, input_ids), **inputs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("teacher"), name)


def reading_student_ids(teacher: torch.nn.Module, teacher_tokenizer: Any, student_tokenizer: Any,
                        why: str) -> TeacherInOwnIds:
    """The teacher reading the ids of a student whose vocabulary was trimmed from its own (`TeacherInOwnIds`);
    any other pair of tokenizers that differ (`why`, from `tokenizer_mismatch`) refused in one line."""
    try:
        index = teacher_ids(teacher_tokenizer, student_tokenizer)
    except UserError as e:
        reason = str(e).split("; ")[0].split(": ", 1)[-1]
    else:
        if index is not None:
            return TeacherInOwnIds(teacher, index)
        reason = "the same tokens"
    raise UserError(f"teacher and student tokenizers differ ({why}; {reason}); the distillation losses need the same "
                    "one, or one trimmed from the teacher's (--trim-vocab)")


def split_otherwise(teacher_tokenizer: Any, student_tokenizer: Any, texts: Iterable[str | None]) -> tuple[int, int]:
    """(texts a trimmed student's tokenizer splits into other tokens than its teacher's, texts): those hold words
    the trimmed vocabulary lacks, which the teacher then reads in pieces its own tokenizer would not choose."""
    texts = [t for t in texts if t is not None]
    return sum(teacher_tokenizer.tokenize(t) != student_tokenizer.tokenize(t) for t in texts), len(texts)


def _rules(tokenizer: Any) -> Any:
    """What splits text into tokens, apart from the vocabulary: a trimmed tokenizer keeps it."""
    fast = getattr(tokenizer, "backend_tokenizer", None)
    if fast is None:
        return type(tokenizer).__name__
    spec = json.loads(fast.to_str())
    model = {k: v for k, v in spec["model"].items() if k not in ("vocab", "merges", "unk_id")}
    return [spec.get("normalizer"), spec.get("pre_tokenizer"), spec.get("decoder"), model]


def trim(model: Any, tokenizer: Any, texts: Iterable[str], trust_remote_code: bool = False) -> tuple[Any, list[int]]:
    """Trim `model` (in place) and `tokenizer` to the tokens `texts` use; returns the new tokenizer and the
    kept ids (the old ids, in order)."""
    backend(tokenizer)  # a tokenizer that cannot be trimmed is refused before the corpus is read
    used = corpus_ids(tokenizer, texts)
    kept = kept_ids(tokenizer, used, _all_configs(model))
    trimmed = trim_tokenizer(tokenizer, kept, trust_remote_code)
    trim_model(model, kept)
    return trimmed, kept


def trim_reported(model: Any, tokenizer: Any, texts: Iterable[str], used_by: str, log: Callable[[str], None],
                  trust_remote_code: bool = False) -> tuple[Any, dict[str, int]]:
    """`trim`, with one line saying what was kept (`used_by`: whose tokens, e.g. "the 7,937 training sentences"):
    the new tokenizer and the manifest's record of it, {kept, of}."""
    before = len(tokenizer)
    trimmed, kept = trim(model, tokenizer, texts, trust_remote_code)
    log(f"vocabulary: {len(kept):,} of {before:,} tokens kept (those {used_by} use, the special tokens, every single "
        "character)")
    return trimmed, {"kept": len(kept), "of": before}
