"""The languages of a multilingual translator (mBART-50, M2M100, NLLB): which code starts its output, and which
code marks its source.

Their tokenizers hold one special token per language (mBART `de_DE`, M2M100 `__de__`, NLLB `deu_Latn`), and the
model writes the language whose code it is made to generate first (`forced_bos_token_id`; an mBART fine-tuned on
one pair may start from the code instead, as its `decoder_start_token_id`). A model whose config fixes neither
would write whatever language its first step favours, so `--target-lang` names one (the code, or its language
part: `de` finds `de_DE` or `__de__`), and a model that needs one and has none is refused in one line. Their
tokenizers also mark the source with its language's code (`src_lang`: mBART puts it after the text, M2M100 and
NLLB before), whose default is whatever the tokenizer was saved with; `--source-lang` sets it. Models with one
target language (Marian, BART, T5) have no codes and need nothing.
"""

from __future__ import annotations

import re
from typing import Any

from modelshrink.errors import UserError

# mBART `de_DE` / `en_XX`, M2M100 `__de__`, NLLB `deu_Latn`
CODE = re.compile(r"^(__[a-z]{2,3}(_[A-Za-z]+)?__|[a-z]{2,3}_[A-Z]{2}|[a-z]{2,3}_[A-Z][a-z]{3})$")


def language_codes(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's language codes (tokens: `de_DE`, `__de__`) and their token ids (empty for a model of one
    target language). M2M100's tokenizer lists its languages by name (`de`, its `lang_code_to_id`) beside the
    tokens; the name is an ordinary word of its vocabulary (`de`), so only the token is a code."""
    to_token = getattr(tokenizer, "lang_code_to_token", None) or {}
    names = {to_token.get(name, name) for name in getattr(tokenizer, "lang_code_to_id", None) or {}}
    names |= {t for t in getattr(tokenizer, "all_special_tokens", []) if isinstance(t, str) and CODE.match(t)}
    return {name: tokenizer.convert_tokens_to_ids(name) for name in sorted(names)}


def tokenizer_language(tokenizer: Any, code: str) -> str:
    """What the tokenizer's `src_lang` / `tgt_lang` take for `code`: the code itself (mBART, NLLB), or the language
    whose token it is (M2M100: `de` for `__de__`)."""
    names = {token: name for name, token in (getattr(tokenizer, "lang_code_to_token", None) or {}).items()}
    return names.get(code, code)


def code_of(tokenizer: Any, language: str | None) -> str | None:
    """The code a tokenizer's `src_lang` / `tgt_lang` value stands for (None for none or an unknown one)."""
    if language is None:
        return None
    code = (getattr(tokenizer, "lang_code_to_token", None) or {}).get(language, language)
    return code if code in language_codes(tokenizer) else None


def set_target(tokenizer: Any, code: str | None) -> None:
    """Make a tokenizer that marks targets (M2M100's and NLLB's `tgt_lang`) mark them with `code`, so that training
    labels open with the code the model is made to generate first."""
    if code is not None and hasattr(tokenizer, "tgt_lang"):
        tokenizer.tgt_lang = tokenizer_language(tokenizer, code)


def find_code(codes: dict[str, int], wanted: str) -> str | None:
    """`wanted` as one of `codes`: itself, or the one code of that language (`de` -> `de_DE` or `__de__`)."""
    if wanted in codes:
        return wanted
    found = [c for c in codes if c == f"__{wanted}__" or c.startswith(f"{wanted}_")]
    return found[0] if len(found) == 1 else None


def _examples(codes: dict[str, int]) -> str:
    shown = list(codes)[:12]
    return ", ".join(shown) + (f" ... ({len(codes)} in all)" if len(codes) > len(shown) else "")


def chosen_code(codes: dict[str, int], flag: str, wanted: str, what: str, one: str, names_rows: bool) -> str | None:
    """The code `wanted` names (FLAG's value); None where the model has no codes and the value names rows."""
    if not codes:
        if names_rows:
            return None
        raise UserError(f"{flag} {wanted}: {what} has no language codes (it {one}); leave {flag} out")
    code = find_code(codes, wanted)
    if code is None:
        raise UserError(f"{flag} {wanted} is not a language of {what}'s tokenizer; its codes: {_examples(codes)}")
    return code


def target_language(model: Any, tokenizer: Any, target_lang: str | None, what: str,
                    names_rows: bool = False) -> str | None:
    """Make `model` generate into `target_lang` (forcing its code first) and return the code it will start with;
    None for a model of one target language. A UserError names what is missing or unknown. `names_rows`: the
    value also picks the target side of nested translation rows (eval), so a model without codes is fine."""
    config = model.generation_config
    code, forced = target_code(language_codes(tokenizer), config.forced_bos_token_id,
                               getattr(model.config, "decoder_start_token_id", None), target_lang, what, names_rows)
    if forced is not None:
        config.forced_bos_token_id = forced
    return code


def target_code(codes: dict[str, int], forced_bos: int | None, decoder_start: int | None, target_lang: str | None,
                what: str, names_rows: bool = False) -> tuple[str | None, int | None]:
    """(the code a translator with these `codes` starts its output with, the token to force first for
    `target_lang`, None to keep its own): the rule of `target_language`, for a PyTorch model or an export
    folder alike (whose forced token and decoder start are read from its own generation config)."""
    if target_lang is not None:
        code = chosen_code(codes, "--target-lang", target_lang, what, "translates into one language", names_rows)
        return code, None if code is None else codes[code]
    by_id = {i: c for c, i in codes.items()}
    for token in (forced_bos, decoder_start):
        if token in by_id:
            return by_id[token], None
    if len(codes) > 1 and forced_bos is None:
        raise UserError(f"{what} translates into {len(codes)} languages and its generation config names none: "
                        f"pass --target-lang (one of {_examples(codes)})")
    return None, None


def source_language(tokenizer: Any, source_lang: str | None, what: str, names_rows: bool = False) -> str | None:
    """Make `tokenizer` mark sources as `source_lang` (its `src_lang`) and return the code it marks them with;
    None for a model without language codes. A UserError names what is missing or unknown. `names_rows`: the
    value also picks the source side of nested translation rows (eval), so a model without codes is fine."""
    codes = language_codes(tokenizer)
    if source_lang is None:
        return code_of(tokenizer, getattr(tokenizer, "src_lang", None))
    code = chosen_code(codes, "--source-lang", source_lang, what, "reads one language", names_rows)
    if code is None:
        return None
    if not hasattr(tokenizer, "src_lang"):
        raise UserError(f"--source-lang {source_lang}: {what}'s tokenizer ({type(tokenizer).__name__}) has language "
                        "codes but no source language to set (src_lang); leave --source-lang out")
    tokenizer.src_lang = tokenizer_language(tokenizer, code)
    return code
