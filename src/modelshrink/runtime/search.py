"""Greedy and beam search in numpy over a decoder's steps, token for token as transformers' `generate`.

The search knows nothing of sessions: `first_step(tokens, hidden, mask)` and `next_step(tokens, mask, past)`
return (logits of the last position [rows, vocab], past keys and values by name), and `search_ops` (or None)
is the onnxruntime session of search_ops.onnx.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .processors import bans, forced, process
from .settings import Search

NEG = np.float32(-1.0e9)
# The first axis of a decoder input that holds one row per document rather than one per beam (the
# cross-attention keys and values after modelshrink.onnx.fuse.per_document_cross_attention)
DOCUMENTS = "documents"
FirstStep = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, dict]]
NextStep = Callable[[np.ndarray, np.ndarray, dict], tuple[np.ndarray, dict]]


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # in place: [rows, vocab] is the big array
    return shifted


def topk(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest per row, largest first (ties: lower index first, as torch.topk on CPU).

    A full stable sort of beam search's [batch, beams x vocab] scores took half of a step's time; the
    partition finds the k-th value, and only the entries at or above it (ties included) are sorted."""
    if k >= x.shape[-1] or x.shape[-1] <= 256:
        return np.argsort(-x, axis=-1, kind="stable")[:, :k]
    kth = -np.partition(-x, k - 1, axis=-1)[:, k - 1]
    out = np.empty((x.shape[0], k), dtype=np.int64)
    for row in range(x.shape[0]):
        above = np.flatnonzero(x[row] >= kth[row])  # ascending, so the stable sort keeps lower indices first
        out[row] = above[np.argsort(-x[row, above], kind="stable")[:k]]
    return out


def take(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    while idx.ndim < x.ndim:
        idx = idx[..., None]
    return np.take_along_axis(x, idx, axis=1)


def greedy(first_step: FirstStep, next_step: NextStep, hidden: np.ndarray, mask: np.ndarray, s: Search) -> np.ndarray:
    """Token ids [batch, length] of greedy search, as `model.generate` returns them."""
    batch = hidden.shape[0]
    pad = s.pad_token_id if s.pad_token_id is not None else (s.eos_token_id[0] if s.eos_token_id else 0)
    out = np.full((batch, max(s.max_length, 1)), pad, dtype=np.int64)  # finished rows: padded, as generate does
    ids = np.arange(batch)  # the rows still generating (a finished row leaves the batch)
    sequences = np.full((batch, 1), s.decoder_start_token_id, dtype=np.int64)
    logits, past = first_step(sequences, hidden, mask)
    while True:
        tokens = process(logits.astype(np.float32), sequences, s).argmax(-1)
        sequences = np.concatenate([sequences, tokens[:, None]], axis=1)
        length = sequences.shape[1]
        ended = np.isin(tokens, s.eos_token_id) if s.eos_token_id else np.zeros(len(tokens), dtype=bool)
        if ended.all() or length >= s.max_length:
            out[ids, :length] = sequences
            return out[:, :length]
        if ended.any():
            out[ids[ended], :length] = sequences[ended]
            alive = np.flatnonzero(~ended)
            ids, sequences, tokens, mask = ids[alive], sequences[alive], tokens[alive], mask[alive]
            past = {n: v[alive] for n, v in past.items()}
        logits, past = next_step(tokens[:, None], mask, past)


@dataclass
class _Beams:
    """Beam search's state, one row per document still searching (`ids`: each row's document)."""

    ids: np.ndarray  # [batch] the original position of each document in the batch
    running: np.ndarray  # [batch, beams, length] the running sequences
    running_scores: np.ndarray  # [batch, beams]
    running_idx: np.ndarray  # [batch, beams, length - 1] the beam each running token came from
    sequences: np.ndarray  # [batch, beams, length] the finished hypotheses, best first
    scores_done: np.ndarray  # [batch, beams]
    beam_idx_done: np.ndarray  # [batch, beams, length - 1]
    finished: np.ndarray  # [batch, beams] whether a finished slot holds a hypothesis
    improvable: np.ndarray  # [batch, 1] whether a running beam can still beat the finished ones

    @classmethod
    def start(cls, batch: int, beams: int, length: int, s: Search) -> _Beams:
        fill = (s.pad_token_id or s.eos_token_id[0]) if s.eos_token_id else -1
        running = np.full((batch, beams, length), fill, dtype=np.int64)
        running[:, :, 0] = s.decoder_start_token_id
        running_scores = np.zeros((batch, beams), dtype=np.float32)
        running_scores[:, 1:] = NEG
        running_idx = np.full((batch, beams, length - 1), -1, dtype=np.int64)
        return cls(ids=np.arange(batch), running=running, sequences=running.copy(), running_scores=running_scores,
                   scores_done=np.full((batch, beams), NEG, dtype=np.float32),
                   finished=np.zeros((batch, beams), dtype=bool), improvable=np.ones((batch, 1), dtype=bool),
                   running_idx=running_idx, beam_idx_done=running_idx.copy())

    def keep(self, alive: np.ndarray) -> None:
        """Only the documents `alive` (rows) search on."""
        self.ids = self.ids[alive]
        self.running, self.running_scores, self.running_idx = \
            self.running[alive], self.running_scores[alive], self.running_idx[alive]
        self.sequences, self.scores_done, self.beam_idx_done = \
            self.sequences[alive], self.scores_done[alive], self.beam_idx_done[alive]
        self.finished, self.improvable = self.finished[alive], self.improvable[alive]


def beam_search(first_step: FirstStep, next_step: NextStep, search_ops: Any, hidden: np.ndarray, mask: np.ndarray,
                s: Search, per_document: frozenset[str] = frozenset()) -> np.ndarray:
    """Token ids [batch, length] of beam search, as `model.generate` returns them. The past entries named in
    `per_document` hold one row per document, shared by its beams; the others one row per beam."""
    # A transcription of transformers' GenerationMixin._beam_search (v5) in numpy, float32 throughout.
    batch, beams, length = hidden.shape[0], s.num_beams, s.max_length
    keep = max(2, 1 + len(s.eos_token_id)) * beams
    state = _Beams.start(batch, beams, length, s)
    done: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # document -> (best sequence, its beam indices)
    # Every beam of a document starts from the same token, so the first step runs once per document and its
    # outputs are repeated for the beams: it computes the cross-attention keys and values of the whole
    # source, which at beam 4 cost as much as two thirds of the encoder when each beam computed its own.
    logits, past = first_step(state.running[:, 0, :1], hidden, mask)
    logits = np.repeat(logits, beams, axis=0)
    past = {n: v if n in per_document else np.repeat(v, beams, axis=0) for n, v in past.items()}
    mask = np.repeat(mask, beams, axis=0)
    cur = 1
    while True:
        reorder, hits = _step(state, search_ops, logits, cur, keep, s)
        cur += 1
        if not _goes_on(state, hits, cur, s):
            break
        _follow_beams(past, reorder, cur)
        if not state.improvable.all():
            # A document that cannot improve keeps its finished hypotheses from here on (transformers goes on
            # computing its beams, whose results are then masked out): it leaves the batch, so the decoder
            # runs only on documents still searching. Only the step's own row numbers (`reorder`) refer to
            # positions in the batch, and they were used just above.
            alive = np.flatnonzero(state.improvable[:, 0])
            for b in np.flatnonzero(~state.improvable[:, 0]):
                done[state.ids[b]] = (state.sequences[b, 0], state.beam_idx_done[b, 0])
            state.keep(alive)
            rows = (alive[:, None] * beams + np.arange(beams)[None, :]).reshape(-1)
            mask = mask[rows]
            past = {n: v[alive] if n in per_document else v[rows] for n, v in past.items()}
        tokens_in = state.running[:, :, cur - 1].reshape(-1, 1)
        logits, past = next_step(tokens_in, mask, past)
    for b, doc in enumerate(state.ids):
        done[doc] = (state.sequences[b, 0], state.beam_idx_done[b, 0])
    best_seq = np.stack([done[d][0] for d in range(len(done))])
    best_idx = np.stack([done[d][1] for d in range(len(done))])
    generated = int((best_idx + 1 != 0).sum(axis=1).max())
    return best_seq[:, :1 + generated]


def _step(state: _Beams, search_ops: Any, logits: np.ndarray, cur: int, keep: int,
          s: Search) -> tuple[np.ndarray, np.ndarray]:
    """One step of the search at position `cur`: the best unfinished continuations run on, the finished ones
    among the top `beams` enter the finished set if they beat it. Returns (the rows each running beam continues,
    flat [batch x beams]; which of the `keep` candidates ended)."""
    batch, beams, length = state.running.shape
    top_mask = np.arange(keep) < beams
    flat = state.running[:, :, :cur].reshape(batch * beams, cur)
    vocab = logits.shape[-1]
    top_scores, top = candidates(search_ops, logits.astype(np.float32, copy=False), flat, state.running_scores,
                                 keep, s)
    from_beam, tokens = top // vocab, top % vocab
    top_idx = take(state.running_idx, from_beam)
    top_seq = take(state.running, from_beam)
    top_seq[:, :, cur] = tokens
    top_idx[:, :, cur - 1] = from_beam + np.arange(batch)[:, None] * beams
    hits = np.isin(tokens, s.eos_token_id) | (cur + 1 >= length)
    # the best unfinished continuations run on
    alive_scores = top_scores + hits.astype(np.float32) * NEG
    nxt = topk(alive_scores, beams)
    state.running, state.running_scores, state.running_idx = \
        take(top_seq, nxt), take(alive_scores, nxt), take(top_idx, nxt)
    # finished continuations among the top `beams` enter the finished set if they beat it
    just_done = hits & top_mask[None, :]
    done_scores = top_scores / np.float32((cur + 1 - 1) ** s.length_penalty)
    full = state.finished.all(axis=-1, keepdims=True) & (s.early_stopping is True)
    done_scores = done_scores + full.astype(np.float32) * NEG
    done_scores = done_scores + (~state.improvable).astype(np.float32) * NEG
    done_scores = done_scores + (~just_done).astype(np.float32) * NEG
    merged_scores = np.concatenate([state.scores_done, done_scores], axis=1)
    best = topk(merged_scores, beams)
    state.sequences = take(np.concatenate([state.sequences, top_seq], axis=1), best)
    state.scores_done = take(merged_scores, best)
    state.beam_idx_done = take(np.concatenate([state.beam_idx_done, top_idx], axis=1), best)
    state.finished = take(np.concatenate([state.finished, just_done], axis=1), best)
    return state.running_idx[:, :, cur - 1].reshape(-1), hits


def _goes_on(state: _Beams, hits: np.ndarray, cur: int, s: Search) -> bool:
    """Whether another step can change the result (updating which documents can still improve); `cur`: the
    length of the sequences after this step."""
    length = state.running.shape[2]
    hypothetical = length - 1 if s.early_stopping == "never" and s.length_penalty > 0 else cur - 1
    best_running = state.running_scores[:, :1] / np.float32(hypothetical ** s.length_penalty)
    worst_done = np.where(state.finished, state.scores_done.min(axis=1, keepdims=True), np.float32(-1.0e9))
    state.improvable = state.improvable & (best_running > worst_done).any(axis=-1, keepdims=True)
    return bool(state.improvable.any() and not (state.finished.all() and s.early_stopping is True)
                and not hits.all())


def _follow_beams(past: dict[str, np.ndarray], reorder: np.ndarray, cur: int) -> None:
    """The self-attention cache follows its beams; most rows continue their own beam, so only the rows that moved
    are copied, and of them the positions filled (cur - 1: a cache written in place has room for more), in place:
    the decoder's outputs are the search's own arrays."""
    moved = np.flatnonzero(reorder != np.arange(reorder.size))
    if moved.size:
        for name, value in past.items():
            if ".decoder." in name:
                value[moved, :, :cur - 1] = value[reorder[moved], :, :cur - 1]


def candidates(search_ops: Any, logits: np.ndarray, flat: np.ndarray, running_scores: np.ndarray, keep: int,
               s: Search) -> tuple[np.ndarray, np.ndarray]:
    """Beam search's `keep` best continuations per document: scores and indices into [beams x vocab],
    best first, ties to the lower index (as torch.topk on the whole row).

    With search_ops.onnx, onnxruntime computes the log-softmax and each beam's top k + (banned tokens
    of that step) in multi-threaded kernels, and numpy ranks only those candidates: adding a beam's
    running score keeps the order inside the beam, so the overall best are among each beam's best.
    Steps that force a token, and folders without the file, take the whole [beams x vocab] row."""
    batch, beams = running_scores.shape
    rows, vocab = logits.shape
    if search_ops is None or forced(flat.shape[1], s):
        log_probs = process(log_softmax(logits), flat, s)
        log_probs = (log_probs.reshape(batch, beams, vocab) + running_scores[:, :, None]).reshape(batch, -1)
        top = topk(log_probs, keep)
        return np.take_along_axis(log_probs, top, axis=1), top
    ban_rows, ban_tokens = bans(flat, s)
    extra = int(np.bincount(ban_rows, minlength=rows).max()) if ban_rows.size else 0
    k = min(keep + extra, vocab)
    values, indices = search_ops.run(None, {"logits": logits, "k": np.array([k], dtype=np.int64)})
    if ban_rows.size:
        found = indices + (np.arange(rows, dtype=np.int64) * vocab)[:, None]
        values = np.where(np.isin(found, ban_rows * vocab + ban_tokens), np.float32(-np.inf), values)
    scores = (values.reshape(batch, beams, k) + running_scores[:, :, None]).reshape(batch, beams * k)
    flat_index = (indices.reshape(batch, beams, k) + (np.arange(beams) * vocab)[None, :, None]).reshape(batch, -1)
    order = np.lexsort((flat_index, -scores), axis=-1)[:, :keep]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(flat_index, order, axis=1)
