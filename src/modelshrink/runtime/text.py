"""Text in and out of an export folder: its tokenizer.json read, ids the model cannot embed read as `<unk>`, and
transformers' clean-up of decoded text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UserError


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _damaged(path: Path, cause: str) -> UserError:
    """The one line for a file of an export folder that cannot be read (as modelshrink.models.files says it)."""
    return UserError(f"cannot load export from {path.parent}: {path.name} is damaged or incomplete ({cause})")


def read_tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception for a file it cannot parse
        raise _damaged(path, f"tokenizers cannot load it: {_first_line(e)}") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def unknown_past(tokenizer: Any, tokenizer_config: dict[str, Any], config: dict[str, Any]) -> tuple[int, int] | None:
    """(the model's embedding rows, its <unk> id): an id from `rows` on reads as <unk>. A tokenizer.json written for
    a tokenizer transformers keeps in Python (modelshrink.models.fast_tokenizers: M2M100's) numbers there the pieces
    its vocabulary lacks, which transformers reads as <unk>. None where the config or the tokenizer does not say."""
    rows = (config.get("decoder") or config).get("vocab_size")
    unk = tokenizer_config.get("unk_token")
    unk = unk.get("content") if isinstance(unk, dict) else unk
    unk_id = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
    return (rows, unk_id) if isinstance(rows, int) and unk_id is not None else None


def clean_up(text: str) -> str:
    # transformers' clean_up_tokenization: spaces that WordPiece-style decoders leave before punctuation
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text
