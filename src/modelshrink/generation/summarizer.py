"""One seq2seq model writing summaries at the attention temperature asked for: what `pseudolabel` (the teacher
labelling its data) and `eval` (the system under test) share.

A `Summarizer` loads the model in the dtype asked for, resolves the generation settings (the options given win
over the model's generation config), the source length and the λ of every attention kind, and plans batches by
size or token budget. Inside `temperature()` its `summarize(batch, make_row)` generates a batch (per-document λ
and sampling seeds included), decodes it, lets the step shape each row, and records the cross attention the
summaries were written with. `--generator` picks who searches: transformers' generate, or the static search
(`modelshrink.generation.static`: fixed shapes and CUDA graphs), which `auto` takes on a GPU wherever it applies. The steps keep what differs: the rows they write, what they count and where the
rows go.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from modelshrink.generation import shards
from modelshrink.errors import UserError
from modelshrink.generation.attention_stats import AttentionRecorder
from modelshrink.generation.settings import decode, generate_ids, plan_batches, resolve_generation, sample_seed
from modelshrink.runtime.inputs import resolve_prefix
from modelshrink.languages import source_language, target_language
from modelshrink.models.loading import load_seq2seq, source_length
from modelshrink.generation.plate import attention_temperature, batch_lambdas, lambdas_of
from modelshrink.precision import torch_dtype

RowFn = Callable[[Any, str, float], dict[str, Any]]  # (example, summary text, its λ) -> the step's row
# `--generator auto` on a GPU searches its first batch with generate too: in float32 any document whose ids differ
# sends the run to generate; in bf16/fp16, where near ties may fall either way, more than this share of them (a
# bound set from reasoning, not yet measured on a GPU: a broken capture differs on nearly every document)
HALF_PRECISION_DIFFERING = 0.1


class Summarizer:
    def __init__(self, options: Any, spec: str, role: str, device: Any, staging: Path | None = None,
                 nested_rows: bool = False, log: Callable[[str], None] | None = None,
                 translation: bool = False) -> None:
        """`staging`: where an attention plot goes; it may be set later (`recorder.folder`), once the run's
        folder exists: the model loads first, so a model that does not load leaves nothing written.
        `nested_rows`: --source-lang/--target-lang also name the sides of nested translation rows (eval).
        `log`: where the one line saying why the static search is not used goes. `translation`: the documents are
        translation sources (no summarization prefix: modelshrink.runtime.inputs)."""
        self.options, self.device = options, device
        self.model, self.tokenizer, self.family = load_seq2seq(spec, role, options.trust_remote_code, device,
                                                               allow_pickle=options.allow_pickle)
        self.model.to(torch_dtype(options.dtype))
        self.settings = resolve_generation(
            self.model.generation_config, num_beams=options.num_beams, length_penalty=options.length_penalty,
            min_length=options.min_length, max_length=options.max_length,
            no_repeat_ngram_size=options.no_repeat_ngram_size, do_sample=getattr(options, "do_sample", False),
            top_p=getattr(options, "top_p", None), top_k=getattr(options, "top_k", None),
            output_temperature=getattr(options, "output_temperature", None))
        self.settings.target_language = target_language(
            self.model, self.tokenizer, getattr(options, "target_lang", None), f"{role} {spec}", names_rows=nested_rows)
        self.settings.source_language = source_language(
            self.tokenizer, getattr(options, "source_lang", None), f"{role} {spec}", names_rows=nested_rows)
        self.prefix = resolve_prefix(getattr(options, "prefix", None), self.model.config, translation)
        self.max_source_length = source_length(options.max_source_length, self.tokenizer, self.model.config)
        self.lambdas = lambdas_of(options)
        self.recorder = AttentionRecorder(options.attention_stats, options.attention_plot, staging, self.tokenizer)
        self.truncated: list[str] = []  # ids of documents longer than --max-tokens
        self._scale = None  # per-document λ, inside temperature()
        self.log = log or (lambda message: None)
        self.static = static_search(self.model, self.settings, self.lambdas, getattr(options, "generator", "auto"),
                                    f"{role} {spec}", self.log)
        self.fallback: str | None = None  # why the static search gave way to generate mid-run (the manifest's)
        self._built = self.static  # kept after a fallback, for what its shapes took
        # auto on a GPU checks the static search against generate on its first batch (the manifest's record of it)
        self.check: dict[str, Any] | None = None
        self._check_first = (getattr(options, "generator", "auto") == "auto" and self.static is not None
                             and self.static.cuda)

    @property
    def static_memory(self) -> dict[str, int] | None:
        """What the static search's shapes took (StaticSearch.memory), where it built any."""
        built = self._built
        return dict(built.memory) if built is not None and built.memory["shapes_built"] else None

    @property
    def generator(self) -> str:
        """Who searched, as the manifest records it."""
        if self.fallback is not None:
            return f"static, then transformers ({self.fallback})"
        return "static" if self.static is not None else "transformers"

    def batches(self, stream: Iterator[Any], log: Callable[[str], None]) -> Iterator[Any]:
        planned = shards.noting_truncation(plan_batches(stream, self.tokenizer, self.options.batch_size,
                                                        self.max_source_length, self.options.max_tokens,
                                                        self.prefix),
                                           self.options.max_tokens, self.truncated, log)
        # on a GPU the host reads and tokenizes the next batches while the device searches
        return shards.prefetched(planned) if self.static is not None and self.static.cuda else planned

    @contextmanager
    def temperature(self) -> Iterator[None]:
        """Everything that generates runs in here, at the λ asked for (the weights are restored after)."""
        with attention_temperature(self.family.attention_modules(self.model), self.lambdas) as scale:
            self._scale = scale
            try:
                yield
            finally:
                self._scale = None

    def _lambdas(self, indexes: list[int]) -> list[float]:
        row_lambdas = batch_lambdas(self.options, indexes)
        if self._scale is not None:
            self._scale.set(row_lambdas)
        return row_lambdas

    def summarize(self, batch: Any, make_row: RowFn) -> list[dict[str, Any]]:
        """One row per document of the batch, in its order, with the attention statistics recorded into them."""
        row_lambdas = self._lambdas([e.index for e in batch.rows])
        padded = self.tokenizer.pad({"input_ids": batch.token_ids}, return_tensors="pt")
        input_ids, mask = padded["input_ids"].to(self.device), padded["attention_mask"].to(self.device)
        seeds = [sample_seed(self.options.seed, e.index) for e in batch.rows] if self.settings.do_sample else None
        ids = self._generate_ids(input_ids, mask, seeds, row_lambdas)
        rows = [make_row(example, text, lam)
                for example, text, lam in zip(batch.rows, decode(self.tokenizer, ids), row_lambdas)]
        self.recorder.record(self.model, rows, [e.id for e in batch.rows], row_lambdas, input_ids, mask, ids)
        return rows

    def generate_one(self, example: Any) -> None:
        """One document alone (batch-1 latency), at its own λ."""
        row_lambdas = self._lambdas([example.index])
        enc = self.tokenizer(self.prefix + example.document, truncation=True, max_length=self.max_source_length,
                             return_tensors="pt")
        self._generate_ids(enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device), None, row_lambdas)

    def _generate_ids(self, input_ids: Any, mask: Any, seeds: list[int] | None, row_lambdas: list[float]) -> Any:
        import torch

        try:
            if self.static is None:
                return generate_ids(self.model, input_ids, mask, self.settings, seeds)
            ids = self._static_ids(input_ids, mask, row_lambdas)
            if self._check_first and self.static is not None:
                self._check_first = False
                ids = self._checked(ids, generate_ids(self.model, input_ids, mask, self.settings, None))
            return ids
        except torch.cuda.OutOfMemoryError:
            raise UserError(f"the GPU ran out of memory generating {input_ids.shape[0]} documents of "
                            f"{input_ids.shape[1]} tokens × {self.settings.num_beams} beams: lower "
                            f"{'--max-tokens' if self.options.max_tokens else '--batch-size'}"
                            + (" (or use --generator transformers)" if self.static is not None else "")) from None

    def _checked(self, ids: Any, expected: Any) -> Any:
        """The first batch's static ids against generate's (`expected`): the run keeps the static search where they
        agree (float32: on every document; half precision: all but HALF_PRECISION_DIFFERING of them), else one line
        and generate writes the run, this batch included (issue 79)."""
        import torch

        pad = self.static.rules.pad_token_id

        def rows(t: Any) -> list[list[int]]:
            return [[token for token in row.tolist() if token != pad] for row in t]

        got, want = rows(ids), rows(expected)
        differing = sum(a != b for a, b in zip(got, want))
        half = self.model.dtype != torch.float32
        allowed = int(HALF_PRECISION_DIFFERING * len(want)) if half else 0
        self.check = {"documents": len(want), "differing": differing, "allowed": allowed,
                      "dtype": str(self.model.dtype).removeprefix("torch."), "passed": differing <= allowed}
        if self.check["passed"]:
            return ids
        self.fallback = f"its first batch differed from generate's on {differing} of {len(want)} documents"
        self.log(f"warning: the static search's first batch differed from transformers' generate on {differing} of "
                 f"{len(want)} documents ({self.check['dtype']}; allowed: {allowed}); generate writes the run "
                 "(--generator static skips this check)")
        self.static.release()
        self.static = None
        return expected

    def _static_ids(self, input_ids: Any, mask: Any, row_lambdas: list[float]) -> Any:
        """The static search's ids for the batch. Out of memory in a shape: every shape released and the batch
        retried once in two halves (still out of memory: the caller's one line). Any other failure (a capture or
        replay error, an empty graph): one line naming it, and transformers' generate writes this batch and every
        later one, so nothing is lost or written twice (issue 79)."""
        import torch

        try:
            try:
                return self.static.generate_ids(input_ids, mask, row_lambdas)
            except torch.cuda.OutOfMemoryError:
                if input_ids.shape[0] < 2:
                    raise
                self.static.release()
                self.log(f"note: out of GPU memory in the static search's shape for {input_ids.shape[0]} documents: "
                         "its shapes released, the batch retried in two halves")
                half = (input_ids.shape[0] + 1) // 2
                parts = [self.static.generate_ids(input_ids[rows], mask[rows], row_lambdas[rows])
                         for rows in (slice(0, half), slice(half, None))]
                return _stacked(parts, self.static.rules.pad_token_id or 0)
        except (torch.cuda.OutOfMemoryError, UserError):
            raise
        except Exception as error:  # noqa: BLE001 - whatever the device did, generate can still write the batch
            cause = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            self.fallback = cause.rstrip(": ")
            self.log(f"warning: the static search failed ({self.fallback}); transformers' generate writes this batch "
                     "and the rest of the run (--generator transformers skips the static search)")
            self.static.release()
            self.static = None
            return generate_ids(self.model, input_ids, mask, self.settings, None)


def _stacked(parts: list[Any], pad: int) -> Any:
    """Id rows of two halves of a batch as one [batch, longest] tensor, the shorter padded as generate pads."""
    import torch

    longest = max(part.shape[1] for part in parts)
    return torch.cat([torch.nn.functional.pad(part, (0, longest - part.shape[1]), value=pad) for part in parts])


def static_search(model: Any, settings: Any, lambdas: dict[str, float | None], generator: str, what: str,
                  log: Callable[[str], None]) -> Any:
    """The static search for this model and settings, or None for transformers' generate: `static` asks for it
    (refused in one line where it cannot run), `auto` takes it wherever it applies (saying why not where it does
    not), `transformers` never. On a GPU it replays CUDA graphs; on a CPU it runs the same step eagerly, which is
    also faster than generate's loop at beam search (benchmarks/cpu_generation.py: 1.28x at beam 4 on 2 cores,
    the same summaries)."""
    from modelshrink.generation.static import StaticSearch, why_not

    if generator == "transformers":
        return None
    reason = why_not(model, settings)
    if reason is not None:
        if generator == "static":
            raise UserError(f"--generator static cannot run {what}: {reason}; use --generator transformers")
        log(f"note: the static search is not used for {what}: {reason}; transformers' generate runs instead")
        return None
    return StaticSearch(model, settings, lambdas)
