"""Generation settings resolved against a model's own generation config, and batch generation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from modelshrink.data import Example
from modelshrink.runtime.inputs import with_prefix

WINDOW_BATCHES = 32  # a window of this many batches is sorted by length at a time


@dataclass
class GenerationSettings:
    num_beams: int
    length_penalty: float
    min_length: int
    max_length: int
    no_repeat_ngram_size: int
    early_stopping: bool | str
    do_sample: bool = False
    top_p: float = 1.0
    top_k: int = 0
    output_temperature: float | None = None
    target_language: str | None = None  # a multilingual translator's code forced first (modelshrink.languages)
    source_language: str | None = None  # the code its tokenizer marks sources with (modelshrink.languages)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_generation(generation_config: Any, *, num_beams: int | None = None, length_penalty: float | None = None,
                       min_length: int | None = None, max_length: int | None = None,
                       no_repeat_ngram_size: int | None = None, do_sample: bool = False, top_p: float | None = None,
                       top_k: int | None = None, output_temperature: float | None = None) -> GenerationSettings:
    """Options the user gave win; the rest come from the model's generation config.

    Sampling (the paper's Sampling / Nucleus baselines) defaults to one beam, top_k 0 and top_p 1.0,
    i.e. plain sampling from the full distribution, unless --top-k / --top-p / --num-beams are given.
    """
    gc = generation_config

    def pick(value: Any, name: str, default: Any) -> Any:
        if value is not None:
            return value
        found = getattr(gc, name, None)
        return default if found is None else found

    return GenerationSettings(
        num_beams=num_beams if num_beams is not None else (1 if do_sample else pick(None, "num_beams", 1)),
        length_penalty=float(pick(length_penalty, "length_penalty", 1.0)),
        min_length=int(pick(min_length, "min_length", 0)),
        max_length=int(pick(max_length, "max_length", 20)),
        no_repeat_ngram_size=int(pick(no_repeat_ngram_size, "no_repeat_ngram_size", 0)),
        early_stopping=pick(None, "early_stopping", False),
        do_sample=do_sample,
        top_p=float(top_p if top_p is not None else 1.0) if do_sample else 1.0,
        top_k=int(top_k if top_k is not None else 0) if do_sample else 0,
        output_temperature=output_temperature,
    )


class OutputTemperature(LogitsProcessor):
    """Temperature T of the final softmax (PLATE Appendix C), for beam search as well as sampling.

    Beam search hands processors log-probabilities; log_softmax(log_softmax(z) / T) equals
    log_softmax(z / T), so renormalising here gives the tempered distribution in every mode.
    """

    def __init__(self, temperature: float):
        if not temperature > 0:
            raise ValueError(f"output temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return torch.log_softmax(scores / self.temperature, dim=-1)


class DocumentSampler(LogitsProcessor):
    """Sampling whose draws belong to the document, not to the batch: each row draws from its own
    generator, seeded by (seed, document index), one uniform number per step. The run asks the model
    for greedy search; this processor, last in line, leaves the sampled token as the only finite
    score, so greedy search takes it. A document gets the same sample whatever batch, process or
    resumed run it lands in. top-k and top-p (nucleus) filter the distribution first, as in
    transformers' warpers."""

    def __init__(self, top_k: int = 0, top_p: float = 1.0):
        self.top_k, self.top_p = top_k, top_p
        self.generators: list[torch.Generator] = []

    def set(self, seeds: list[int]) -> None:
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if len(self.generators) != scores.shape[0]:
            raise RuntimeError(f"{len(self.generators)} seeds for a batch of {scores.shape[0]} rows")
        logits = scores.float()
        if self.top_k > 0:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True, dim=-1)
            before = ordered.cumsum(-1) - ordered  # mass of the more likely tokens
            ordered = ordered.masked_fill(before >= self.top_p, 0.0)  # the first token always stays
            probs = torch.zeros_like(probs).scatter(-1, order, ordered)
        cumulative = probs.cumsum(-1)
        draws = torch.cat([torch.rand(1, generator=g) for g in self.generators]).to(probs.device)
        chosen = torch.searchsorted(cumulative, (draws * cumulative[:, -1]).unsqueeze(-1), right=True)
        chosen = chosen.clamp_(max=probs.shape[-1] - 1)
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(-1, chosen, 0.0)


def sample_seed(seed: int, index: int) -> int:
    """The sampling seed of document `index`: a function of (seed, index) alone."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def generate_ids(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 settings: GenerationSettings, seeds: list[int] | None = None) -> torch.Tensor:
    """Generated token ids for one batch ([batch, length], starting with the decoder start token).
    Sampling needs `seeds`, one per row (`sample_seed(seed, document index)`)."""
    processors = LogitsProcessorList()
    if settings.output_temperature is not None and settings.output_temperature != 1.0:
        processors.append(OutputTemperature(settings.output_temperature))
    if settings.do_sample:
        if seeds is None:
            raise ValueError("sampling needs one seed per row")
        sampler = DocumentSampler(settings.top_k, settings.top_p)
        sampler.set(seeds)
        processors.append(sampler)
    kwargs: dict[str, Any] = dict(
        num_beams=settings.num_beams, length_penalty=settings.length_penalty, min_length=settings.min_length,
        max_length=settings.max_length, no_repeat_ngram_size=settings.no_repeat_ngram_size,
        early_stopping=settings.early_stopping, do_sample=False, num_return_sequences=1,
    )
    with torch.inference_mode():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, logits_processor=processors,
                              **kwargs)


def decode(tokenizer: Any, ids: torch.Tensor) -> list[str]:
    return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def generate(model: Any, tokenizer: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             settings: GenerationSettings, seeds: list[int] | None = None) -> list[str]:
    """Summaries for one batch, decoded without special tokens."""
    return decode(tokenizer, generate_ids(model, input_ids, attention_mask, settings, seeds))


@dataclass
class Batch:
    number: int
    rows: list[Example] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    truncated: list[tuple[Example, int]] = field(default_factory=list)  # (document, its length) cut to max_tokens


def plan_batches(stream: Iterator[Example], tokenizer: Any, batch_size: int, max_source_length: int,
                 max_tokens: int | None = None, prefix: str = "") -> Iterator[Batch]:
    """Batches of documents sorted longest first within windows of WINDOW_BATCHES × batch_size
    documents, so that padding is small while the input is still streamed; the numbering is
    deterministic. With `max_tokens`, a batch holds as many documents as fit the padded-token
    budget (longest × count <= max_tokens) instead of `batch_size`; a document longer than the
    budget is truncated to it (and listed in its batch's `truncated`). Each document is read behind the model's
    `prefix` (modelshrink.runtime.inputs)."""
    number = 0
    window: list[Example] = []

    def flush(window: list[Example]) -> Iterator[Batch]:
        nonlocal number
        texts = with_prefix([e.document for e in window], prefix)
        ids = tokenizer(texts, truncation=True, max_length=max_source_length)["input_ids"]
        cut: dict[int, int] = {}
        if max_tokens is not None:
            for i, one in enumerate(ids):
                if len(one) > max_tokens:
                    cut[i] = len(one)
                    ids[i] = tokenizer(texts[i], truncation=True, max_length=max_tokens)["input_ids"]
        order = sorted(range(len(window)), key=lambda i: -len(ids[i]))
        start = 0
        while start < len(order):
            size = batch_size if max_tokens is None else max(1, max_tokens // len(ids[order[start]]))
            chosen = order[start:start + size]
            yield Batch(number, [window[i] for i in chosen], [ids[i] for i in chosen],
                        [(window[i], cut[i]) for i in chosen if i in cut])
            number += 1
            start += size

    for example in stream:
        window.append(example)
        if len(window) == batch_size * WINDOW_BATCHES:
            yield from flush(window)
            window = []
    if window:
        yield from flush(window)
