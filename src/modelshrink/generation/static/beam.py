"""Beam and greedy search as fixed-shape tensor updates: every step reads and writes the same buffers, the
step number is a device tensor, and nothing asks the host anything, so a whole step can be captured once
in a CUDA graph and replayed.

The beam update is transformers' `GenerationMixin._beam_search` (v5) step for step, as
`modelshrink.runtime.search.beam_search` transcribes it in numpy, with one difference of shape only: a
document that can no longer improve stays in the batch (transformers does the same; its finished
hypotheses are then masked from every later update), so the batch never shrinks. Running steps after
every document has stopped changes no output, which is what lets the caller look at the stop flag only
every few steps.

The logits processors are transformers' (in its order), restricted to what a fixed shape can do:
no-repeat n-grams, single-token bad words, min length, forced BOS, forced EOS, suppressed tokens, and
the output temperature of PLATE's Appendix C (a caller's processor, so applied last).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG = -1.0e9


@dataclass(frozen=True)
class Rules:
    """What shapes each step's scores; resolved by the runner from the settings and the generation config."""

    num_beams: int
    max_length: int
    min_length: int
    length_penalty: float
    early_stopping: bool | str
    no_repeat_ngram_size: int
    decoder_start_token_id: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    forced_bos_token_id: int | None
    forced_eos_token_ids: tuple[int, ...]
    banned_token_ids: tuple[int, ...]  # bad words of one token
    suppressed_token_ids: tuple[int, ...]
    output_temperature: float | None


class Processors:
    """transformers' logits processors over [rows, vocab] scores, for sequences [rows, max_length] filled up to
    `length` (a device tensor) — without a host branch on the step."""

    def __init__(self, rules: Rules, vocab: int, device: torch.device):
        self.rules = rules
        self.vocab = vocab
        self.eos = torch.tensor(rules.eos_token_ids, dtype=torch.long, device=device)
        self.banned = torch.tensor(rules.banned_token_ids, dtype=torch.long, device=device)
        self.suppressed = torch.tensor(rules.suppressed_token_ids, dtype=torch.long, device=device)
        self.forced_bos = self._forced_row((rules.forced_bos_token_id,) if rules.forced_bos_token_id is not None
                                           else (), device)
        self.forced_eos = self._forced_row(rules.forced_eos_token_ids, device)
        self.window_start = torch.arange(max(rules.max_length - max(rules.no_repeat_ngram_size, 1) + 1, 1),
                                         device=device)

    def _forced_row(self, tokens: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
        if not tokens:
            return None
        row = torch.full((self.vocab,), float("-inf"), device=device)
        row[list(tokens)] = 0.0
        return row

    def __call__(self, scores: torch.Tensor, sequences: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        r = self.rules
        n = r.no_repeat_ngram_size
        if n > 0:
            scores = self._no_repeat(scores, sequences, length, n)
        if self.banned.numel():
            scores = scores.index_fill(1, self.banned, float("-inf"))
        if r.min_length > 0 and self.eos.numel():
            short = length < r.min_length
            scores = scores.index_copy(1, self.eos, torch.where(short, float("-inf"), scores.index_select(1, self.eos)))
        if self.forced_bos is not None:
            scores = torch.where(length == 1, self.forced_bos, scores)
        if self.forced_eos is not None:
            scores = torch.where(length == r.max_length - 1, self.forced_eos, scores)
        if self.suppressed.numel():
            scores = scores.index_fill(1, self.suppressed, float("-inf"))
        if r.output_temperature is not None and r.output_temperature != 1.0:
            scores = torch.log_softmax(scores / r.output_temperature, dim=-1)
        return scores

    def _no_repeat(self, scores: torch.Tensor, sequences: torch.Tensor, length: torch.Tensor, n: int) -> torch.Tensor:
        # every n-gram whose first n-1 tokens equal the sequence's last n-1 bans its last token; windows past the
        # filled part are ignored (their bans add 0)
        windows = sequences.unfold(1, n, 1)  # [rows, max_length - n + 1, n]
        last = (length - (n - 1) + torch.arange(n - 1, device=sequences.device)).clamp(min=0)
        prefix = sequences.index_select(1, last)  # [rows, n - 1]
        hits = (windows[:, :, :n - 1] == prefix[:, None, :]).all(-1) & (self.window_start <= length - n)[None, :]
        hits = hits & (length >= n)
        penalty = torch.where(hits, float("-inf"), 0.0).to(scores.dtype)
        return scores.scatter_add(1, windows[:, :, n - 1], penalty)


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[b, index[b, j], ...] for every b, j."""
    while index.dim() < x.dim():
        index = index.unsqueeze(-1)
    return torch.gather(x, 1, index.expand(*index.shape[:2], *x.shape[2:]))


class BeamState:
    """Beam search's running and finished hypotheses for `documents` × `num_beams`, updated in place."""

    def __init__(self, rules: Rules, documents: int, vocab: int, device: torch.device):
        self.rules, self.documents, self.vocab = rules, documents, vocab
        beams, length = rules.num_beams, rules.max_length
        self.keep = max(2, 1 + len(rules.eos_token_ids)) * beams
        self.processors = Processors(rules, vocab, device)
        fill = (rules.pad_token_id or rules.eos_token_ids[0]) if rules.eos_token_ids else -1
        self.fill = fill
        dev = dict(device=device)
        self.length = torch.ones(1, dtype=torch.long, **dev)  # tokens in every running sequence
        self.running = torch.full((documents, beams, length), fill, dtype=torch.long, **dev)
        self.running_scores = torch.zeros(documents, beams, **dev)
        self.running_idx = torch.full((documents, beams, length - 1), -1, dtype=torch.long, **dev)
        self.sequences = torch.full((documents, beams, length), fill, dtype=torch.long, **dev)
        self.scores_done = torch.full((documents, beams), NEG, **dev)
        self.idx_done = torch.full((documents, beams, length - 1), -1, dtype=torch.long, **dev)
        self.finished = torch.zeros(documents, beams, dtype=torch.bool, **dev)
        self.improvable = torch.ones(documents, 1, dtype=torch.bool, **dev)
        self.go_on = torch.ones((), dtype=torch.bool, **dev)
        self.tokens = torch.zeros(documents * beams, dtype=torch.long, **dev)  # the decoder's next input
        self.reorder_rows = torch.arange(documents * beams, **dev)
        self.top_mask = torch.arange(self.keep, **dev) < beams
        self.offsets = torch.arange(documents, **dev)[:, None] * beams
        self.real = torch.ones(documents, dtype=torch.bool, **dev)  # documents that are not padding of the shape
        # (t ** length_penalty) in double, then float32, as transformers divides by a Python float
        self.penalties = torch.tensor([float(t) ** rules.length_penalty if t else 1.0 for t in range(length + 1)],
                                      dtype=torch.float32, **dev)
        self.reset(documents)

    def reset(self, real: int) -> None:
        """A new batch whose first `real` documents are documents (the rest only fill the shape: they are
        stopped from the start and take no part in the stop conditions)."""
        r = self.rules
        self.real.copy_(torch.arange(self.documents, device=self.real.device) < real)
        self.length.fill_(1)
        self.running.fill_(self.fill)
        self.running[:, :, 0] = r.decoder_start_token_id
        self.running_scores.zero_()
        self.running_scores[:, 1:] = NEG
        self.running_idx.fill_(-1)
        self.sequences.copy_(self.running)
        self.scores_done.fill_(NEG)
        self.idx_done.fill_(-1)
        self.finished.zero_()
        self.improvable.copy_(self.real[:, None])
        self.go_on.fill_(True)
        self.tokens.fill_(r.decoder_start_token_id)
        self.count = real

    def update(self, logits: torch.Tensor) -> None:
        """One step: the logits [documents × beams, vocab] of the running beams' next token."""
        r, documents, beams, vocab = self.rules, self.documents, self.rules.num_beams, self.vocab
        cur = self.length  # [1]
        flat = self.running.view(documents * beams, r.max_length)
        log_probs = self.processors(torch.log_softmax(logits.float(), dim=-1), flat, cur)
        scores = (log_probs.view(documents, beams, vocab) + self.running_scores[:, :, None]).view(documents, -1)
        top_scores, top = torch.topk(scores, self.keep, dim=1)
        from_beam, tokens = top // vocab, top % vocab
        top_idx = _take(self.running_idx, from_beam)
        top_seq = _take(self.running, from_beam)
        top_seq.scatter_(2, cur.view(1, 1, 1).expand(documents, self.keep, 1), tokens[:, :, None])
        top_idx.scatter_(2, (cur - 1).view(1, 1, 1).expand(documents, self.keep, 1),
                         (from_beam + self.offsets)[:, :, None])
        hits = torch.isin(tokens, self.processors.eos) | (cur + 1 >= r.max_length)
        # the best unfinished continuations run on
        alive_scores = top_scores + hits.float() * NEG
        nxt = torch.topk(alive_scores, beams, dim=1).indices
        self.running.copy_(_take(top_seq, nxt))
        self.running_scores.copy_(_take(alive_scores, nxt))
        self.running_idx.copy_(_take(top_idx, nxt))
        # finished continuations among the top `beams` enter the finished set if they beat it
        just_done = hits & self.top_mask[None, :]
        done_scores = top_scores / self.penalties.index_select(0, cur)
        full = self.finished.all(dim=-1, keepdim=True) & (r.early_stopping is True)
        done_scores = done_scores + full.float() * NEG + (~self.improvable).float() * NEG + (~just_done).float() * NEG
        merged = torch.cat([self.scores_done, done_scores], dim=1)
        best = torch.topk(merged, beams, dim=1).indices
        self.sequences.copy_(_take(torch.cat([self.sequences, top_seq], dim=1), best))
        self.scores_done.copy_(_take(merged, best))
        self.idx_done.copy_(_take(torch.cat([self.idx_done, top_idx], dim=1), best))
        self.finished.copy_(_take(torch.cat([self.finished, just_done], dim=1), best))
        self.reorder_rows.copy_(self.running_idx.index_select(2, cur - 1).view(-1))
        self.length.add_(1)
        if r.early_stopping == "never" and r.length_penalty > 0:
            hypothetical = self.penalties[r.max_length - 1]
        else:
            hypothetical = self.penalties.index_select(0, self.length - 1)
        best_running = self.running_scores[:, :1] / hypothetical
        worst_done = torch.where(self.finished, self.scores_done.min(dim=1, keepdim=True).values,
                                 torch.full_like(self.scores_done, NEG))
        self.improvable.logical_and_((best_running > worst_done).any(dim=-1, keepdim=True))
        all_finished = (self.finished.all(dim=-1) | ~self.real).all()
        stop = (~self.improvable.any()) | (all_finished & (r.early_stopping is True)) | \
            (hits.all(dim=-1) | ~self.real).all()
        self.go_on.logical_and_(~stop)
        self.tokens.copy_(self.running.index_select(2, self.length - 1).view(-1))

    def result(self) -> torch.Tensor:
        """The best finished sequence of each document, cut after the longest as transformers cuts it."""
        best_seq, best_idx = self.sequences[:self.count, 0], self.idx_done[:self.count, 0]
        generated = int((best_idx + 1 != 0).sum(dim=1).max())
        return best_seq[:, :1 + generated]


class GreedyState:
    """Greedy search (one beam): the argmax of the processed logits; a finished row is padded from then on."""

    def __init__(self, rules: Rules, documents: int, vocab: int, device: torch.device):
        self.rules, self.documents, self.vocab = rules, documents, vocab
        self.processors = Processors(rules, vocab, device)
        self.pad = rules.pad_token_id if rules.pad_token_id is not None else \
            (rules.eos_token_ids[0] if rules.eos_token_ids else 0)
        dev = dict(device=device)
        self.length = torch.ones(1, dtype=torch.long, **dev)
        self.sequences = torch.full((documents, rules.max_length), self.pad, dtype=torch.long, **dev)
        self.unfinished = torch.ones(documents, dtype=torch.bool, **dev)
        self.ended_at = torch.full((documents,), rules.max_length, dtype=torch.long, **dev)
        self.go_on = torch.ones((), dtype=torch.bool, **dev)
        self.tokens = torch.zeros(documents, dtype=torch.long, **dev)
        self.reorder_rows = None
        self.reset(documents)

    def reset(self, real: int) -> None:
        self.length.fill_(1)
        self.sequences.fill_(self.pad)
        self.sequences[:, 0] = self.rules.decoder_start_token_id
        self.unfinished.copy_(torch.arange(self.documents, device=self.unfinished.device) < real)
        self.ended_at.copy_(torch.where(self.unfinished, self.rules.max_length, 0))
        self.count = real
        self.go_on.fill_(True)
        self.tokens.fill_(self.rules.decoder_start_token_id)

    def update(self, logits: torch.Tensor) -> None:
        cur = self.length
        scores = self.processors(logits.float(), self.sequences, cur)
        tokens = torch.where(self.unfinished, scores.argmax(dim=-1), self.pad)
        self.sequences.scatter_(1, cur.view(1, 1).expand(self.documents, 1), tokens[:, None])
        ended = self.unfinished & torch.isin(tokens, self.processors.eos)
        self.ended_at.copy_(torch.where(ended, cur + 1, self.ended_at))
        self.unfinished.logical_and_(~ended)
        self.length.add_(1)
        self.go_on.logical_and_(self.unfinished.any() & (self.length[0] < self.rules.max_length))
        self.tokens.copy_(tokens)

    def result(self) -> torch.Tensor:
        return self.sequences[:self.count, :int(self.ended_at.max())]
