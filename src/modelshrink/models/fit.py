"""Whether a tokenizer fits its model: every id its text or the model's search can produce has a row to embed.

The Hub's own checkpoints are not always exact. bart-large, bart-large-cnn and every distilbart-cnn ship RoBERTa's
tokenizer of 50,265 tokens for an embedding of 50,264 rows: `<mask>` (id 50,264) has no row. transformers loads
them and generates with them, since no ordinary text tokenizes to `<mask>` and the LM head (50,264 rows) never
scores it; a document that holds the literal string would index past the embedding. Such a token (special, past
the embedding, named by no id field of the model's config) is no reason to refuse the model: its tokenizer stops
matching it in text (`drop_unembedded`, so that a literal `<mask>` is read as ordinary characters, here and in an
export's tokenizer.json), and everything else goes on. A tokenizer whose ordinary vocabulary runs past the
embedding, or a config that forces an id the embedding lacks, does not fit and is refused in one line.
"""

from __future__ import annotations

import json
from typing import Any

from modelshrink.families import ENCODER_DECODER_TYPE

# config fields whose ids the model is made to produce or read whatever the text (the search's forced tokens)
FORCED_IDS = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "forced_bos_token_id",
              "forced_eos_token_id")


def embedding_rows(config: Any) -> int | None:
    """How many token ids the model embeds (its vocabulary; a bert2bert's decoder's)."""
    inner = getattr(config, "decoder", None) if getattr(config, "model_type", None) == ENCODER_DECODER_TYPE else None
    return getattr(inner or config, "vocab_size", None)


def _forced(config: Any) -> set[int]:
    ids: set[int] = set()
    for name in FORCED_IDS:
        value = getattr(config, name, None)
        ids.update(v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, int))
    return ids


def unembedded_specials(tokenizer: Any, config: Any) -> dict[str, int]:
    """The special tokens past the model's embedding that neither text nor search needs (bart-large-cnn's `<mask>`),
    by token; empty when the tokenizer fits or when anything past the embedding is more than such a token."""
    rows = embedding_rows(config)
    if not rows or len(tokenizer) <= rows:
        return {}
    past = {i: t for t, i in tokenizer.get_vocab().items() if i >= rows}
    special = {i for i in getattr(tokenizer, "all_special_ids", []) or [] if isinstance(i, int)}
    if set(past) - special or set(past) & _forced(config) or getattr(tokenizer, "backend_tokenizer", None) is None:
        return {}
    return {t: i for i, t in sorted(past.items())}


def drop_unembedded(tokenizer: Any, tokens: dict[str, int]) -> None:
    """Make the tokenizer read `tokens` in text as ordinary characters: they leave its added-token matcher (the id
    stays in the vocabulary, so `mask_token_id` still answers). Its saved tokenizer.json matches them no more."""
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["added_tokens"] = [t for t in spec.get("added_tokens", []) if t["content"] not in tokens]
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))


def tokenizer_misfit(tokenizer: Any, config: Any) -> str | None:
    """Why a tokenizer cannot be the model's (None: it can): ids beyond the model's vocabulary that text or search
    can reach (see `unembedded_specials` for the ones that cannot), no ordinary token at all (a tokenizer rebuilt
    from its config alone holds only its special tokens), or special tokens at other ids than the model's config
    names."""
    vocab = embedding_rows(config)
    size = len(tokenizer)
    if vocab and size > vocab and not unembedded_specials(tokenizer, config):
        past = sorted(i for i in tokenizer.get_vocab().values() if i >= vocab)
        shown = ", ".join(repr(tokenizer.convert_ids_to_tokens(i)) for i in past[:3])
        return f"{size} tokens, the model's vocabulary {vocab}; past it: {shown}" + (
            f" and {len(past) - 3} more" if len(past) > 3 else "")
    special = set(getattr(tokenizer, "all_special_tokens", []) or [])
    if size <= len(special) + 1:
        return f"it holds {size} tokens, only its special ones"
    for name in ("pad_token_id", "eos_token_id"):
        mine, model = getattr(tokenizer, name, None), getattr(config, name, None)
        if isinstance(model, int) and mine is not None and mine != model:
            return f"its {name} is {mine}, the model's {model}"
    return None
