"""Logits processors, in transformers' order: no-repeat n-grams, min length, forced BOS, forced EOS."""

from __future__ import annotations

import numpy as np

from .settings import Search


def bans(sequences: np.ndarray, s: Search) -> tuple[np.ndarray, np.ndarray]:
    """(rows, tokens) that no_repeat_ngram and min_length set to -inf for `sequences` [rows, len]."""
    cur_len = sequences.shape[1]
    rows, tokens = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    n = s.no_repeat_ngram_size
    if n > 0 and cur_len >= n:
        # every n-gram of a row whose first n-1 tokens equal the row's last n-1 bans its last token
        # (transformers' loop over rows and n-grams, in one vectorized pass: beam search calls this every step)
        windows = np.lib.stride_tricks.sliding_window_view(sequences, n, axis=1)  # [rows, cur_len-n+1, n]
        hits = (windows[:, :, :n - 1] == sequences[:, None, cur_len + 1 - n:]).all(axis=-1)
        rows, where = np.nonzero(hits)
        tokens = windows[rows, where, n - 1]
    if s.min_length > 0 and s.eos_token_id and cur_len < s.min_length:
        eos = np.array(s.eos_token_id, dtype=np.int64)
        rows = np.concatenate([rows, np.repeat(np.arange(sequences.shape[0]), eos.size)])
        tokens = np.concatenate([tokens, np.tile(eos, sequences.shape[0])])
    return rows, tokens


def forced(cur_len: int, s: Search) -> bool:
    return (s.forced_bos_token_id is not None and cur_len == 1) or \
        bool(s.forced_eos_token_id and cur_len == s.max_length - 1)


def process(scores: np.ndarray, sequences: np.ndarray, s: Search) -> np.ndarray:
    """no_repeat_ngram, min_length, forced BOS, forced EOS on [rows, vocab] scores for `sequences` [rows, len]."""
    cur_len = sequences.shape[1]
    rows, tokens = bans(sequences, s)
    if rows.size:
        scores[rows, tokens] = -np.inf
    if s.forced_bos_token_id is not None and cur_len == 1:
        scores[:] = -np.inf
        scores[:, s.forced_bos_token_id] = 0
    if s.forced_eos_token_id and cur_len == s.max_length - 1:
        scores[:] = -np.inf
        scores[:, list(s.forced_eos_token_id)] = 0
    return scores
