"""Run an export folder with onnxruntime, tokenizers and numpy only: no torch, no transformers.

    from modelshrink.runtime import load
    model = load("runs/student-onnx")
    model.summarize(["a long document ..."])          # greedy or beam search, the generation config's settings
    model.classify(["a sentence"])                    # class ids (or values, for a regression head)

The search reproduces transformers' `generate` step for step (greedy; beam search with its finished-
beam bookkeeping, length penalty and early stopping; min length, no-repeat n-grams, forced BOS / EOS),
so that the same settings give the same tokens as PyTorch; `export` checks that they do.

Command line (also torch-free): `python -m modelshrink.runtime DIR --input docs.jsonl`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np

ENCODER, DECODER, DECODER_WITH_PAST, CLASSIFIER = ("encoder_model.onnx", "decoder_model.onnx",
                                                  "decoder_with_past_model.onnx", "model.onnx")
DECODER_MERGED = "decoder_model_merged.onnx"
SEARCH_OPS = "search_ops.onnx"  # log-softmax and per-row top-k for beam search: logits, k -> values, indices
NEG = np.float32(-1.0e9)
DEQUANTIZED = "int8 initializers + DequantizeLinear"


class RuntimeError_(Exception):
    """An export folder that cannot be run (missing files, unknown task)."""


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


# ---------------------------------------------------------------- logits processors (transformers' order)

def _bans(sequences: np.ndarray, s: Search) -> tuple[np.ndarray, np.ndarray]:
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


def _forced(cur_len: int, s: Search) -> bool:
    return (s.forced_bos_token_id is not None and cur_len == 1) or \
        bool(s.forced_eos_token_id and cur_len == s.max_length - 1)


def _process(scores: np.ndarray, sequences: np.ndarray, s: Search) -> np.ndarray:
    """no_repeat_ngram, min_length, forced BOS, forced EOS on [rows, vocab] scores for `sequences` [rows, len]."""
    cur_len = sequences.shape[1]
    rows, tokens = _bans(sequences, s)
    if rows.size:
        scores[rows, tokens] = -np.inf
    if s.forced_bos_token_id is not None and cur_len == 1:
        scores[:] = -np.inf
        scores[:, s.forced_bos_token_id] = 0
    if s.forced_eos_token_id and cur_len == s.max_length - 1:
        scores[:] = -np.inf
        scores[:, list(s.forced_eos_token_id)] = 0
    return scores


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # in place: [rows, vocab] is the big array
    return shifted


def _topk(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest per row, largest first (ties: lower index first, as torch.topk on CPU).

    A full stable sort of beam search's [batch, beams x vocab] scores took half of a step's time; the
    partition finds the k-th value, and only the entries at or above it (ties included) are sorted."""
    if k >= x.shape[-1] or x.shape[-1] <= 256:
        return np.argsort(-x, axis=-1, kind="stable")[:, :k]
    kth = -np.partition(-x, k - 1, axis=-1)[:, k - 1]
    out = np.empty((x.shape[0], k), dtype=np.int64)
    for row in range(x.shape[0]):
        candidates = np.flatnonzero(x[row] >= kth[row])  # ascending, so the stable sort keeps lower indices first
        out[row] = candidates[np.argsort(-x[row, candidates], kind="stable")[:k]]
    return out


def _take(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    while idx.ndim < x.ndim:
        idx = idx[..., None]
    return np.take_along_axis(x, idx, axis=1)


class ExportedModel:
    """An export folder loaded into onnxruntime sessions."""

    def __init__(self, folder: str | os.PathLike, threads: int | None = None, spin: bool = False):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        if not (self.folder / "config.json").is_file():
            raise RuntimeError_(f"{folder} is not an export folder (no config.json)")
        self.config = json.loads((self.folder / "config.json").read_text())
        generation = self.folder / "generation_config.json"
        self.generation = json.loads(generation.read_text()) if generation.is_file() else {}
        if not (self.folder / "tokenizer.json").is_file():
            raise RuntimeError_(f"{folder} has no tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        tok_config = self.folder / "tokenizer_config.json"
        self.tokenizer_config = json.loads(tok_config.read_text()) if tok_config.is_file() else {}
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
        options.log_severity_level = 3
        if not spin:
            # onnxruntime's worker threads spin after every run by default, waiting for more work; here the
            # encoder, decoder and search-ops sessions (each with its own threads) and numpy take turns on
            # the same cores, so spinning threads slow whichever runs next: without spinning a 6-2 MiniLM
            # student summarized 1.8x faster at batch 1 and 1.5x at batch 16 on 2 cores (int8)
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        manifest = self.folder / "modelshrink.json"
        resolved = json.loads(manifest.read_text()).get("resolved", {}) if manifest.is_file() else {}
        if resolved.get("weights") == DEQUANTIZED:
            # onnxruntime would fuse DequantizeLinear + MatMul into an integer matmul that also quantizes the
            # activations, which is not what the quantized model computes; keep the float matmul
            options.add_session_config_entry("session.disable_quant_qdq", "1")

        def session(name: str):
            return ort.InferenceSession(str(self.folder / name), options, providers=["CPUExecutionProvider"])

        if (self.folder / ENCODER).is_file():
            self.task = "summarization"
            self.encoder = session(ENCODER)
            self.merged = (self.folder / DECODER_MERGED).is_file()
            if self.merged:  # one graph: an If on use_cache_branch between the two decoders
                self.decoder = self.decoder_with_past = session(DECODER_MERGED)
            else:
                self.decoder, self.decoder_with_past = session(DECODER), session(DECODER_WITH_PAST)
            inputs = {i.name: i.shape for i in self.decoder_with_past.get_inputs()}
            self.past_names = [n for n in inputs if n.startswith("past")]
            # the static axes (heads, head size, width) of the inputs that a merged decoder's other branch ignores
            self._static = {n: [d if isinstance(d, int) else 0 for d in shape] for n, shape in inputs.items()}
            self.output_names = {"first": [o.name for o in self.decoder.get_outputs()],
                                 "past": [o.name for o in self.decoder_with_past.get_outputs()]}
            self.search = search_from_configs(self.config, self.generation)
            self.search_ops = session(SEARCH_OPS) if (self.folder / SEARCH_OPS).is_file() else None
        elif (self.folder / CLASSIFIER).is_file():
            self.classifier = session(CLASSIFIER)
            self.classifier_inputs = {i.name for i in self.classifier.get_inputs()}
            self.task = "classification"
        else:
            raise RuntimeError_(f"{folder} holds neither {ENCODER} nor {CLASSIFIER}")

    # ------------------------------------------------------------ text in and out

    @property
    def max_source_length(self) -> int:
        limit = self.tokenizer_config.get("model_max_length")
        if isinstance(limit, (int, float)) and limit < 100_000:
            return int(limit)
        for holder in (self.config, self.config.get("encoder", {})):
            if holder.get("max_position_embeddings"):
                return int(holder["max_position_embeddings"])
        return 1024

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer_config.get("pad_token")
        found = self.tokenizer.token_to_id(pad) if isinstance(pad, str) else None
        return found if found is not None else int(self.config.get("pad_token_id") or 0)

    def encode(self, texts: list[str], pairs: list[str] | None = None,
               max_length: int | None = None) -> dict[str, np.ndarray]:
        self.tokenizer.enable_truncation(max_length or self.max_source_length)
        encoded = self.tokenizer.encode_batch(list(zip(texts, pairs)) if pairs else texts)
        width = max(len(e.ids) for e in encoded)
        ids = np.full((len(encoded), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        types = np.zeros((len(encoded), width), dtype=np.int64)
        for row, e in enumerate(encoded):  # right padding, as transformers' tokenizers for these models
            ids[row, :len(e.ids)], mask[row, :len(e.ids)], types[row, :len(e.ids)] = e.ids, 1, e.type_ids
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def decode(self, ids: np.ndarray) -> list[str]:
        texts = self.tokenizer.decode_batch([row.tolist() for row in ids], skip_special_tokens=True)
        if self.tokenizer_config.get("clean_up_tokenization_spaces"):
            texts = [_clean_up(t) for t in texts]
        return [t.strip() for t in texts]

    # ------------------------------------------------------------ summarization

    def settings(self, **overrides: Any) -> Search:
        return replace(self.search, **{k: v for k, v in overrides.items() if v is not None})

    def summarize(self, documents: list[str], batch_size: int = 16, max_source_length: int | None = None,
                  **overrides: Any) -> list[str]:
        settings = self.settings(**overrides)
        out: list[str] = []
        for start in range(0, len(documents), batch_size):
            enc = self.encode(documents[start:start + batch_size], max_length=max_source_length)
            out += self.decode(self.generate_ids(enc["input_ids"], enc["attention_mask"], settings))
        return out

    def _encoder(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]

    def _empty(self, name: str, batch: int) -> np.ndarray:
        shape = list(self._static[name])
        shape[0] = batch  # every other dynamic axis (source, past length) empty
        return np.zeros(shape, dtype=np.float32)

    def run_decoder(self, feed: dict[str, np.ndarray], with_past: bool) -> dict[str, np.ndarray]:
        """One decoder call, first step or with past (feed: that graph's inputs); every output by name.
        With a merged decoder, the inputs only the other branch reads are fed empty."""
        if not self.merged:
            session = self.decoder_with_past if with_past else self.decoder
            return dict(zip(self.output_names["past" if with_past else "first"], session.run(None, feed)))
        feed = dict(feed, use_cache_branch=np.array([with_past]))
        batch = feed["input_ids"].shape[0]
        for name in self._static:
            if name not in feed:
                feed[name] = self._empty(name, batch)
        out = dict(zip(self.output_names["first"], self.decoder.run(None, feed)))
        return {n: v for n, v in out.items() if not (with_past and ".encoder." in n)}  # empty in that branch

    def _first_step(self, tokens: np.ndarray, hidden: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, dict]:
        out = self.run_decoder({"input_ids": tokens, "encoder_attention_mask": mask, "encoder_hidden_states": hidden},
                               with_past=False)
        logits = out.pop("logits")
        return logits[:, -1, :], {n.replace("present", "past_key_values"): v for n, v in out.items()}

    def _next_step(self, tokens: np.ndarray, mask: np.ndarray, past: dict) -> tuple[np.ndarray, dict]:
        feed = {"input_ids": tokens, "encoder_attention_mask": mask, **{n: past[n] for n in self.past_names}}
        out = self.run_decoder(feed, with_past=True)
        logits = out.pop("logits")
        new = dict(past)  # cross-attention keys and values do not change after the first step
        new.update({n.replace("present", "past_key_values"): v for n, v in out.items()})
        return logits[:, -1, :], new

    def generate_ids(self, input_ids: np.ndarray, attention_mask: np.ndarray, settings: Search | None = None) -> np.ndarray:
        """Token ids [batch, length] starting with the decoder start token, as `model.generate` returns them."""
        settings = settings or self.search
        hidden = self._encoder(input_ids, attention_mask)
        if settings.num_beams > 1:
            return self._beam_search(hidden, attention_mask, settings)
        return self._greedy(hidden, attention_mask, settings)

    def _greedy(self, hidden: np.ndarray, mask: np.ndarray, s: Search) -> np.ndarray:
        batch = hidden.shape[0]
        pad = s.pad_token_id if s.pad_token_id is not None else (s.eos_token_id[0] if s.eos_token_id else 0)
        out = np.full((batch, max(s.max_length, 1)), pad, dtype=np.int64)  # finished rows: padded, as generate does
        ids = np.arange(batch)  # the rows still generating (a finished row leaves the batch)
        sequences = np.full((batch, 1), s.decoder_start_token_id, dtype=np.int64)
        logits, past = self._first_step(sequences, hidden, mask)
        while True:
            tokens = _process(logits.astype(np.float32), sequences, s).argmax(-1)
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
            logits, past = self._next_step(tokens[:, None], mask, past)

    def _beam_search(self, hidden: np.ndarray, mask: np.ndarray, s: Search) -> np.ndarray:
        # A transcription of transformers' GenerationMixin._beam_search (v5) in numpy, float32 throughout.
        batch, beams, length = hidden.shape[0], s.num_beams, s.max_length
        keep = max(2, 1 + len(s.eos_token_id)) * beams
        top_mask = np.arange(keep) < beams
        fill = (s.pad_token_id or s.eos_token_id[0]) if s.eos_token_id else -1
        running = np.full((batch, beams, length), fill, dtype=np.int64)
        running[:, :, 0] = s.decoder_start_token_id
        ids = np.arange(batch)  # the original position of each document still in the batch
        done: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # document -> (best sequence, its beam indices)
        sequences = running.copy()
        running_scores = np.zeros((batch, beams), dtype=np.float32)
        running_scores[:, 1:] = NEG
        scores_done = np.full((batch, beams), NEG, dtype=np.float32)
        finished = np.zeros((batch, beams), dtype=bool)
        improvable = np.ones((batch, 1), dtype=bool)
        running_idx = np.full((batch, beams, length - 1), -1, dtype=np.int64)
        beam_idx_done = running_idx.copy()
        hidden, mask = np.repeat(hidden, beams, axis=0), np.repeat(mask, beams, axis=0)
        cur = 1
        logits, past = self._first_step(running[:, :, :1].reshape(batch * beams, 1), hidden, mask)
        while True:
            flat = running[:, :, :cur].reshape(batch * beams, cur)
            vocab = logits.shape[-1]
            top_scores, top = self._candidates(logits.astype(np.float32, copy=False), flat, running_scores, keep, s)
            from_beam, tokens = top // vocab, top % vocab
            top_idx = _take(running_idx, from_beam)
            top_seq = _take(running, from_beam)
            top_seq[:, :, cur] = tokens
            top_idx[:, :, cur - 1] = from_beam + np.arange(batch)[:, None] * beams
            hits = np.isin(tokens, s.eos_token_id) | (cur + 1 >= length)
            # the best unfinished continuations run on
            alive_scores = top_scores + hits.astype(np.float32) * NEG
            nxt = _topk(alive_scores, beams)
            running, running_scores, running_idx = _take(top_seq, nxt), _take(alive_scores, nxt), _take(top_idx, nxt)
            # finished continuations among the top `beams` enter the finished set if they beat it
            just_done = hits & top_mask[None, :]
            done_scores = top_scores / np.float32((cur + 1 - 1) ** s.length_penalty)
            full = finished.all(axis=-1, keepdims=True) & (s.early_stopping is True)
            done_scores = done_scores + full.astype(np.float32) * NEG
            done_scores = done_scores + (~improvable).astype(np.float32) * NEG
            done_scores = done_scores + (~just_done).astype(np.float32) * NEG
            merged_scores = np.concatenate([scores_done, done_scores], axis=1)
            best = _topk(merged_scores, beams)
            sequences = _take(np.concatenate([sequences, top_seq], axis=1), best)
            scores_done = _take(merged_scores, best)
            beam_idx_done = _take(np.concatenate([beam_idx_done, top_idx], axis=1), best)
            finished = _take(np.concatenate([finished, just_done], axis=1), best)
            reorder = running_idx[:, :, cur - 1].reshape(-1)
            cur += 1
            hypothetical = length - 1 if s.early_stopping == "never" and s.length_penalty > 0 else cur - 1
            best_running = running_scores[:, :1] / np.float32(hypothetical ** s.length_penalty)
            worst_done = np.where(finished, scores_done.min(axis=1, keepdims=True), np.float32(-1.0e9))
            improvable = improvable & (best_running > worst_done).any(axis=-1, keepdims=True)
            go_on = improvable.any() and not (finished.all() and s.early_stopping is True) and not hits.all()
            if not go_on:
                break
            past = {n: (v[reorder] if ".decoder." in n else v) for n, v in past.items()}
            if not improvable.all():
                # A document that cannot improve keeps its finished hypotheses from here on (transformers goes on
                # computing its beams, whose results are then masked out): it leaves the batch, so the decoder
                # runs only on documents still searching. Only the step's own row numbers (`reorder`) refer to
                # positions in the batch, and they were used just above.
                alive = np.flatnonzero(improvable[:, 0])
                for b in np.flatnonzero(~improvable[:, 0]):
                    done[ids[b]] = (sequences[b, 0], beam_idx_done[b, 0])
                ids = ids[alive]
                running, running_scores, running_idx = running[alive], running_scores[alive], running_idx[alive]
                sequences, scores_done, beam_idx_done = sequences[alive], scores_done[alive], beam_idx_done[alive]
                finished, improvable = finished[alive], improvable[alive]
                rows = (alive[:, None] * beams + np.arange(beams)[None, :]).reshape(-1)
                mask = mask[rows]
                past = {n: v[rows] for n, v in past.items()}
                batch = alive.size
            tokens_in = running[:, :, cur - 1].reshape(-1, 1)
            logits, past = self._next_step(tokens_in, mask, past)
        for b, doc in enumerate(ids):
            done[doc] = (sequences[b, 0], beam_idx_done[b, 0])
        best_seq = np.stack([done[d][0] for d in range(len(done))])
        best_idx = np.stack([done[d][1] for d in range(len(done))])
        generated = int((best_idx + 1 != 0).sum(axis=1).max())
        return best_seq[:, :1 + generated]

    def _candidates(self, logits: np.ndarray, flat: np.ndarray, running_scores: np.ndarray, keep: int,
                    s: Search) -> tuple[np.ndarray, np.ndarray]:
        """Beam search's `keep` best continuations per document: scores and indices into [beams x vocab],
        best first, ties to the lower index (as torch.topk on the whole row).

        With search_ops.onnx, onnxruntime computes the log-softmax and each beam's top k + (banned tokens
        of that step) in multi-threaded kernels, and numpy ranks only those candidates: adding a beam's
        running score keeps the order inside the beam, so the overall best are among each beam's best.
        Steps that force a token, and folders without the file, take the whole [beams x vocab] row."""
        batch, beams = running_scores.shape
        rows, vocab = logits.shape
        if self.search_ops is None or _forced(flat.shape[1], s):
            log_probs = _process(_log_softmax(logits), flat, s)
            log_probs = (log_probs.reshape(batch, beams, vocab) + running_scores[:, :, None]).reshape(batch, -1)
            top = _topk(log_probs, keep)
            return np.take_along_axis(log_probs, top, axis=1), top
        ban_rows, ban_tokens = _bans(flat, s)
        extra = int(np.bincount(ban_rows, minlength=rows).max()) if ban_rows.size else 0
        k = min(keep + extra, vocab)
        values, indices = self.search_ops.run(None, {"logits": logits, "k": np.array([k], dtype=np.int64)})
        if ban_rows.size:
            candidates = indices + (np.arange(rows, dtype=np.int64) * vocab)[:, None]
            values = np.where(np.isin(candidates, ban_rows * vocab + ban_tokens), np.float32(-np.inf), values)
        scores = (values.reshape(batch, beams, k) + running_scores[:, :, None]).reshape(batch, beams * k)
        flat_index = (indices.reshape(batch, beams, k) + (np.arange(beams) * vocab)[None, :, None]).reshape(batch, -1)
        order = np.lexsort((flat_index, -scores), axis=-1)[:, :keep]
        return np.take_along_axis(scores, order, axis=1), np.take_along_axis(flat_index, order, axis=1)

    def parameter_count(self) -> int:
        """Values held by the graphs' initializers (a separate decoder with past repeats the decoder's: skipped)."""
        import onnx

        names = [ENCODER, DECODER_MERGED if self.merged else DECODER] if self.task == "summarization" \
            else [CLASSIFIER]
        total = 0
        for name in names:
            for init in onnx.load(str(self.folder / name), load_external_data=False).graph.initializer:
                total += int(np.prod(init.dims)) if len(init.dims) else 1
        return total

    # ------------------------------------------------------------ classification

    def logits(self, texts: list[str], pairs: list[str] | None = None, max_length: int | None = None) -> np.ndarray:
        enc = self.encode(texts, pairs, max_length)
        return self.classifier.run(None, {k: v for k, v in enc.items() if k in self.classifier_inputs})[0]

    def classify(self, texts: list[str], pairs: list[str] | None = None, batch_size: int = 32) -> list[Any]:
        """Class ids, or values for a one-output (regression) head, as `modelshrink.classify.predict`."""
        out: list[Any] = []
        for start in range(0, len(texts), batch_size):
            logits = self.logits(texts[start:start + batch_size],
                                 pairs[start:start + batch_size] if pairs else None)
            out += [float(x) for x in logits[:, 0]] if logits.shape[-1] == 1 else [int(x) for x in logits.argmax(-1)]
        return out


def _clean_up(text: str) -> str:
    # transformers' clean_up_tokenization: spaces that WordPiece-style decoders leave before punctuation
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


def load(folder: str | os.PathLike, threads: int | None = None, spin: bool = False) -> ExportedModel:
    """An export folder in onnxruntime sessions with `threads` intra-op threads each (default: the usable
    cores); `spin=True` lets their threads busy-wait between runs (onnxruntime's default, slower here)."""
    return ExportedModel(folder, threads, spin)


def is_export(folder: str | os.PathLike) -> bool:
    """An export folder: ONNX graphs beside config.json (what `modelshrink export` writes)."""
    folder = Path(folder)
    return folder.is_dir() and (folder / "config.json").is_file() and \
        ((folder / ENCODER).is_file() or (folder / CLASSIFIER).is_file())


def _read_texts(path: str, column: str | None) -> tuple[list[dict[str, Any]], str]:
    opener = open
    if path.endswith(".gz"):
        import gzip

        opener = gzip.open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise RuntimeError_(f"{path} has no rows")
    column = column or next((c for c in ("document", "article", "text", "sentence", "source") if c in rows[0]), None)
    if column is None or column not in rows[0]:
        raise RuntimeError_(f"{path} has no text column; columns found: {', '.join(rows[0])}; name one with --column")
    return rows, column


def run_file(folder: str, input_path: str, column: str | None = None, limit: int | None = None,
             batch_size: int = 16, **overrides: Any) -> Iterable[dict[str, Any]]:
    """Rows {id, prediction} for a JSON-lines file, in input order."""
    model = load(folder)
    rows, column = _read_texts(input_path, column)
    rows = rows[:limit] if limit else rows
    texts = [str(r[column]) for r in rows]
    predictions = model.summarize(texts, batch_size, **overrides) if model.task == "summarization" \
        else model.classify(texts, batch_size=batch_size)
    for index, (row, prediction) in enumerate(zip(rows, predictions)):
        yield {"id": str(row.get("id", index)), "prediction": prediction}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m modelshrink.runtime",
                                     description="Summarize or classify with an export folder (no torch).")
    parser.add_argument("folder")
    parser.add_argument("--input", required=True, help="JSON lines with a document/text column (.gz too)")
    parser.add_argument("--column", default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-beams", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        for row in run_file(args.folder, args.input, args.column, args.limit, args.batch_size,
                            num_beams=args.num_beams, max_length=args.max_length):
            print(json.dumps(row, ensure_ascii=False))
    except (RuntimeError_, OSError, json.JSONDecodeError) as e:
        print("Error: " + " ".join(str(e).split()), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
