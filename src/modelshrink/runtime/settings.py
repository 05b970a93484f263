"""Generation settings, named and resolved as transformers names and resolves them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Search:
    """Generation settings, named as in a generation config."""

    num_beams: int = 1
    max_length: int = 20
    min_length: int = 0
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    no_repeat_ngram_size: int = 0
    decoder_start_token_id: int = 0
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: tuple[int, ...] = ()


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def search_from_configs(config: dict[str, Any], generation: dict[str, Any]) -> Search:
    """What transformers would take from generation_config.json, with config.json as the fallback."""
    def pick(name: str, default: Any) -> Any:
        for source in (generation, config, config.get("decoder", {})):
            if source.get(name) is not None:
                return source[name]
        return default

    start = pick("decoder_start_token_id", None)
    if start is None:
        start = pick("bos_token_id", 0)
    return Search(num_beams=int(pick("num_beams", 1)), max_length=int(pick("max_length", 20)),
                  min_length=int(pick("min_length", 0)), length_penalty=float(pick("length_penalty", 1.0)),
                  early_stopping=pick("early_stopping", False),
                  no_repeat_ngram_size=int(pick("no_repeat_ngram_size", 0) or 0), decoder_start_token_id=int(start),
                  eos_token_id=_ids(pick("eos_token_id", None)), pad_token_id=pick("pad_token_id", None),
                  forced_bos_token_id=generation.get("forced_bos_token_id"),
                  forced_eos_token_id=_ids(generation.get("forced_eos_token_id")))
