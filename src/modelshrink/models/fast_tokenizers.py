"""A `tokenizer.json` for tokenizers that transformers keeps in Python alone, so that an export folder runs them
with the `tokenizers` library (the torch-free runtime).

M2M100's tokenizer (and so a many-to-many translator distilled from facebook/m2m100_418M or 1.2B) has no fast form
in transformers: it splits text with a SentencePiece BPE model, then looks each piece up in its own vocab.json (ids
that differ from the SentencePiece model's; 390 of its 128,000 pieces have none and read as `<unk>`), and marks a
source with its language code in front and `</s>` behind. `m2m100_fast` builds the same thing from those two
files: SentencePiece's normalizer (its precompiled NFKC map, spaces collapsed and escaped as "▁", a dummy prefix in
front of every run of text between added tokens), its merges ranked by piece score, vocab.json's ids, the language
codes and made-up words as added special tokens, and a post-processor for the source language the tokenizer was
saved with (an export folder reads one source language, as it forces one target language). The tests compare its
ids with transformers' on real text.
"""

from __future__ import annotations

from typing import Any

from modelshrink.errors import UserError

NORMAL = 1  # SentencePiece's type of an ordinary piece


def _proto(path: str) -> Any:
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as e:  # sentencepiece reads its model with protobuf
        raise UserError(f"writing a tokenizer.json for this tokenizer needs the sentencepiece and protobuf packages "
                        f"({e}); pip install sentencepiece protobuf") from None
    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def _merges(proto: Any) -> list[tuple[str, str]]:
    """SentencePiece BPE's merges as the tokenizers library wants them: every split of a normal piece into two
    normal pieces, the higher-scored (earlier learned) piece first, kept where the tokenizer's vocabulary has all
    three (a piece vocab.json lacks is still merged: it reads as `<unk>`, as in transformers)."""
    normal = {p.piece: (p.score, i) for i, p in enumerate(proto.pieces) if p.type == NORMAL}
    ranked = []
    for token, (score, index) in normal.items():
        for split in range(1, len(token)):
            left, right = token[:split], token[split:]
            if left in normal and right in normal:
                ranked.append((-score, index, left, right))
    return [(left, right) for _, _, left, right in sorted(ranked)]


def m2m100_fast(tokenizer: Any, rows: int = 0) -> Any:
    """M2M100's tokenizer as a `tokenizers.Tokenizer` (see the module): the same ids for sources marked with its
    `src_lang`, the same text back from ids. `rows`: the model's embedding rows (M2M100 has 8 more than its tokenizer
    names), past which the pieces vocab.json lacks are numbered."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    proto = _proto(tokenizer.spm_file)
    if proto.trainer_spec.model_type != 2 or proto.trainer_spec.byte_fallback:
        raise UserError(f"{tokenizer.spm_file} is not the SentencePiece BPE model (no byte fallback) M2M100 uses")
    vocab = dict(tokenizer.encoder)
    # the language codes and made-up words, past vocab.json: in the model's vocabulary at their own ids, so that
    # adding them below keeps those ids (the added tokens would otherwise be numbered after every entry above)
    named = set(tokenizer.all_special_tokens)
    specials = sorted(((i, t) for t, i in tokenizer.get_vocab().items() if i >= len(tokenizer.encoder) or t in named),
                      key=lambda pair: pair[0])
    vocab.update({t: i for i, t in specials})
    # the pieces vocab.json lacks, which transformers reads as <unk>: numbered past every id of the tokenizer (the
    # runtime reads an id past the model's embedding as <unk>); one shared id would make their merges collide
    unseen = max(max(vocab.values()) + 1, rows)
    for index, piece in enumerate(p.piece for p in proto.pieces if p.piece not in vocab):
        vocab[piece] = unseen + index
    model = BPE(vocab=vocab, merges=_merges(proto), unk_token=str(tokenizer.unk_token), fuse_unk=True)
    fast = Tokenizer(model)
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    fast.normalizer = normalizers.Sequence(steps)
    fast.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    fast.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    added = fast.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in specials])
    wrong = [(t, i, fast.token_to_id(t)) for i, t in specials if fast.token_to_id(t) != i]
    if wrong or added < 0:
        raise UserError(f"M2M100 tokenizer.json: added tokens at other ids than the tokenizer's: {wrong[:3]}")
    code = tokenizer.get_lang_token(tokenizer.src_lang)
    eos = str(tokenizer.eos_token)
    fast.post_processor = processors.TemplateProcessing(
        single=f"{code} $A {eos}", pair=f"{code} $A $B {eos}",
        special_tokens=[(code, tokenizer.convert_tokens_to_ids(code)), (eos, tokenizer.eos_token_id)])
    return fast


CONVERTERS = {"M2M100Tokenizer": m2m100_fast}


def fast_form(tokenizer: Any, rows: int = 0) -> str | None:
    """The tokenizer's tokenizer.json text, written by `CONVERTERS` for a tokenizer transformers has no fast form
    of (`rows`: the model's embedding rows); None for one it knows no way to convert."""
    convert = CONVERTERS.get(type(tokenizer).__name__)
    return None if convert is None else convert(tokenizer, rows).to_str()
