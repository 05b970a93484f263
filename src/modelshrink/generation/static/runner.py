"""The static search: batches padded to a few fixed shapes, each shape's buffers allocated once and its
decoder step (decoder, logits processors, beam update, cache reorder) captured once in a CUDA graph.

`StaticSearch(model, settings, lambdas)` is built once per run; `generate_ids(input_ids, mask, row_lambdas)`
returns what `transformers.generate` returns for the batch. A batch of documents × source tokens runs in
the shape (documents rounded up a ladder of 1, 2, 3, 4, 6, 8, 12, …; source tokens rounded up to a multiple
of 32); the encoder runs on the batch itself, the shape's extra documents are padding that is stopped
from the first step. On a CPU the same step runs eagerly (the tests' parity runs); on CUDA each shape is
warmed up and captured on first use, and the host reads the stop flag every `CHECK_EVERY` steps only.

`why_not(model, settings)` says, in words, why a model or setting cannot take this path (None: it can):
the caller prints it and uses transformers' generate.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from modelshrink.generation.static.beam import BeamState, GreedyState, Rules
from modelshrink.generation.static.decoders import decoder_for, unsupported

CHECK_EVERY = 8  # steps between two reads of the stop flag on a GPU
SOURCE_STEP = 32  # source lengths are rounded up to a multiple of this
MAX_SHAPES = 24  # shapes kept (buffers and graphs); the least recently used goes first
SMALLEST_BUCKET = 16  # cache positions the first steps read on a GPU (length_buckets)
# On a GPU a new shape is built only where the device has its bytes free, this many times over (the captured
# step's own activations come from the graph pool beside the buffers): shapes least recently used are released
# until it does, so memory is bounded by bytes, not by the count alone (issue 79)
FREE_MARGIN = 1.5

# generation_config fields whose processors the static search does not implement, with the value that
# means "off"
_OFF = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "sequence_bias": None,
        "encoder_no_repeat_ngram_size": 0, "min_new_tokens": None, "max_new_tokens": None,
        "exponential_decay_length_penalty": None, "begin_suppress_tokens": None, "guidance_scale": None,
        "renormalize_logits": False, "remove_invalid_values": False, "num_beam_groups": 1,
        "diversity_penalty": 0.0, "force_words_ids": None, "constraints": None}


def why_not(model: Any, settings: Any) -> str | None:
    """Why `model` with these settings cannot take the static search (None: it can)."""
    if settings.do_sample:
        return "sampling (--do-sample) is not written for it"
    if settings.max_length is not None and settings.max_length <= 2:  # its warm-up steps would pass the cache's end
        return f"max_length {settings.max_length} is one step at most, nothing a fixed-shape search gains on"
    reason = unsupported(model)
    if reason:
        return reason
    config = model.generation_config
    for name, off in _OFF.items():
        value = getattr(config, name, off)
        if value is not None and value != off and not (off == 0 and not value):
            return f"the model's generation config sets {name}={value!r}"
    bad = getattr(config, "bad_words_ids", None) or []
    if any(len(words) != 1 for words in bad):
        return "the model's generation config bans words of several tokens (bad_words_ids)"
    return None


def rules_of(model: Any, settings: Any) -> Rules:
    config = model.generation_config

    def ids(value: Any) -> tuple[int, ...]:
        if value is None:
            return ()
        return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)

    eos = ids(config.eos_token_id if config.eos_token_id is not None else model.config.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else model.config.pad_token_id
    if pad is None and eos:
        pad = eos[0]
    start = config.decoder_start_token_id
    if start is None:
        start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = config.bos_token_id if config.bos_token_id is not None else model.config.bos_token_id
    return Rules(num_beams=settings.num_beams, max_length=settings.max_length, min_length=settings.min_length,
                 length_penalty=float(settings.length_penalty), early_stopping=settings.early_stopping,
                 no_repeat_ngram_size=settings.no_repeat_ngram_size, decoder_start_token_id=int(start),
                 eos_token_ids=eos, pad_token_id=None if pad is None else int(pad),
                 forced_bos_token_id=config.forced_bos_token_id, forced_eos_token_ids=ids(config.forced_eos_token_id),
                 banned_token_ids=tuple(words[0] for words in (getattr(config, "bad_words_ids", None) or [])),
                 suppressed_token_ids=ids(getattr(config, "suppress_tokens", None)),
                 output_temperature=settings.output_temperature)


def length_buckets(max_length: int, smallest: int = SMALLEST_BUCKET) -> list[int]:
    """The cache lengths a step reads on a GPU, one captured graph each: smallest, twice that, ... below max_length,
    then max_length. A step reads the smallest bucket that holds what was written, so attention and the beams'
    cache reorder cost about the tokens written, not the longest summary allowed (issue 79)."""
    buckets, size = [], smallest
    while size < max_length:
        buckets.append(size)
        size *= 2
    return [*buckets, max_length]


def bucket_for(written: int, buckets: list[int]) -> int:
    return next(size for size in buckets if size >= written)


def ladder(n: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, … that is >= n."""
    if n <= 2:
        return max(n, 1)
    power = 2 ** (math.ceil(math.log2(n)) - 1)
    return power + power // 2 if n <= power + power // 2 else 2 * power


@dataclass
class Shape:
    documents: int
    source: int
    buffers: dict[str, torch.Tensor]
    state: Any
    self_scale: torch.Tensor | None
    cross_scale: torch.Tensor | None
    graphs: dict[int, Any] = field(default_factory=dict)  # a captured step for each length bucket


class StaticSearch:
    """Fixed-shape generation for one model and one set of settings (see the module's doc)."""

    def __init__(self, model: Any, settings: Any, lambdas: dict[str, float | None]):
        reason = why_not(model, settings)
        if reason:
            raise ValueError(reason)
        self.model = model
        self.rules = rules_of(model, settings)
        self.device = model.device
        self.cuda = self.device.type == "cuda"
        self.decoder = decoder_for(model, self.rules.max_length, self.rules.pad_token_id or 0)
        self.vocab = self.decoder.head.weight.shape[0]
        self.per_document = {kind for kind, lam in lambdas.items() if lam is None}
        self.shapes: OrderedDict[tuple[int, int], Shape] = OrderedDict()
        self.pool = torch.cuda.graph_pool_handle() if self.cuda else None
        # the cache lengths steps read: on a GPU a few buckets, one graph each; eagerly, what was written
        self.buckets = length_buckets(self.rules.max_length) if self.cuda else None
        self.warmup_seconds: dict[tuple[int, int], float] = {}
        # what the shapes took: their count, the largest one's bytes (buffers and step activations, computed
        # before allocating) and the shapes released to make room (the manifest's static_search_memory)
        self.memory = {"shapes_built": 0, "largest_shape_bytes": 0, "released_for_memory": 0}

    def shape_bytes(self, documents: int, source: int) -> int:
        """A shape's bytes before it is built: its caches and buffers, and the step's logits-sized activations
        (scores, log-probabilities and their top-k: about four [rows, vocabulary] float32 tensors)."""
        rows = documents * self.rules.num_beams
        return self.decoder.buffer_bytes(rows, documents, source) + 4 * rows * self.vocab * 4

    def _make_room(self, needed: int) -> None:
        """Release shapes, least recently used first, until the device has `needed` bytes free FREE_MARGIN times
        over (or none is left)."""
        while self.shapes and torch.cuda.mem_get_info(self.device)[0] < FREE_MARGIN * needed:
            self.shapes.popitem(last=False)
            torch.cuda.empty_cache()
            self.memory["released_for_memory"] += 1

    def shape_for(self, documents: int, source: int) -> Shape:
        key = (ladder(documents), SOURCE_STEP * math.ceil(source / SOURCE_STEP))
        shape = self.shapes.get(key)
        if shape is not None:
            self.shapes.move_to_end(key)
            return shape
        while len(self.shapes) >= MAX_SHAPES:
            self.shapes.popitem(last=False)
        needed = self.shape_bytes(*key)
        if self.cuda:
            self._make_room(needed)
        self.memory["shapes_built"] += 1
        self.memory["largest_shape_bytes"] = max(self.memory["largest_shape_bytes"], needed)
        rows = key[0] * self.rules.num_beams
        state_type = BeamState if self.rules.num_beams > 1 else GreedyState
        state = state_type(self.rules, key[0], self.vocab, self.device)

        def scale() -> torch.Tensor:
            return torch.ones(rows, device=self.device)

        shape = Shape(key[0], key[1], self.decoder.allocate(rows, key[0], key[1]), state,
                      scale() if "decoder_self" in self.per_document else None,
                      scale() if "decoder_cross" in self.per_document else None)
        self.shapes[key] = shape
        return shape

    def release(self) -> None:
        """Every shape's buffers and graphs let go (and, on a GPU, the cached memory returned)."""
        self.shapes.clear()
        if self.cuda:
            torch.cuda.empty_cache()

    def _length(self, written: int) -> int:
        """The cache positions a step reads once `written` are: those, or on a GPU their bucket."""
        return written if self.buckets is None else bucket_for(written, self.buckets)

    def _step(self, shape: Shape, length: int | None = None) -> None:
        """One decoder step and beam update, reading and reordering the caches' first `length` positions (at least
        those written after it; None: all of them)."""
        state = shape.state
        logits = self.decoder.step(shape.buffers, state.tokens, state.length - 1, shape.self_scale, shape.cross_scale,
                                   length)
        state.update(logits)
        if state.reorder_rows is not None:
            self.decoder.reorder(shape.buffers, state.reorder_rows, length)

    def _start(self, shape: Shape, memory: torch.Tensor, mask: torch.Tensor, row_lambdas: list[float] | None) -> None:
        documents = memory.shape[0]
        padded = torch.zeros(shape.documents, shape.source, memory.shape[-1], dtype=memory.dtype, device=self.device)
        padded[:documents, :memory.shape[1]] = memory
        padded_mask = torch.zeros(shape.documents, shape.source, dtype=torch.bool, device=self.device)
        padded_mask[:documents, :mask.shape[1]] = mask.bool()
        padded_mask[documents:, 0] = True  # padding documents attend to one (zero) position: no empty softmax
        self.decoder.start(shape.buffers, padded, padded_mask)
        shape.state.reset(documents)
        if row_lambdas is not None:
            scales = torch.ones(shape.documents)
            scales[:documents] = torch.tensor(row_lambdas, dtype=torch.float32).rsqrt()
            scales = scales.repeat_interleave(self.rules.num_beams).to(self.device)
            for buffer in (shape.self_scale, shape.cross_scale):
                if buffer is not None:
                    buffer.copy_(scales)

    def _capture(self, shape: Shape) -> None:
        """For each length bucket: warm the step up on a side stream (it mutates the state, reset before each
        bucket; the caller starts the batch again after), then record it, on the model's device (the caller holds
        `torch.cuda.device`: the capture's own stream is the current device's). A graph that captured nothing (the
        step's kernels ran elsewhere) is an error: its replays would write nothing."""
        import warnings

        started = time.perf_counter()
        for length in self.buckets:
            shape.state.reset(shape.documents)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step(shape, length)
            torch.cuda.current_stream(self.device).wait_stream(side)
            shape.state.reset(shape.documents)
            graph = torch.cuda.CUDAGraph()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with torch.cuda.graph(graph, pool=self.pool):
                    self._step(shape, length)
            if any("empty" in str(w.message).lower() for w in caught):
                raise RuntimeError(f"the CUDA graph captured on {self.device} is empty (the step ran on another "
                                   "device)")
            shape.graphs[length] = graph
        torch.cuda.synchronize(self.device)
        self.warmup_seconds[(shape.documents, shape.source)] = time.perf_counter() - started

    @torch.inference_mode()
    def generate_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     row_lambdas: list[float] | None = None) -> torch.Tensor:
        """Token ids [batch, length] for one batch, as transformers' generate returns them (the encoder runs with
        whatever hooks the caller installed, e.g. per-document λ on the encoder's self attention)."""
        with torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext():
            return self._search(input_ids, attention_mask, row_lambdas)

    def _search(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                row_lambdas: list[float] | None) -> torch.Tensor:
        memory = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        shape = self.shape_for(input_ids.shape[0], input_ids.shape[1])
        self._start(shape, memory, attention_mask, row_lambdas if self.per_document else None)
        if self.cuda and not shape.graphs:
            self._capture(shape)
            self._start(shape, memory, attention_mask, row_lambdas if self.per_document else None)
        for step in range(self.rules.max_length - 1):
            length = self._length(step + 1)
            if length in shape.graphs:
                shape.graphs[length].replay()
            else:
                self._step(shape, length)
            if (not self.cuda or (step + 1) % CHECK_EVERY == 0) and not bool(shape.state.go_on):
                break
        return shape.state.result()
