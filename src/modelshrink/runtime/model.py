"""An export folder in onnxruntime sessions: text in and out, the decoder's steps, classification.

onnxruntime and tokenizers are imported when a folder is loaded, not when this module is, so that
`modelshrink.errors` can import the runtime's error type cheaply. A folder that cannot be loaded (a file
missing, truncated or unreadable) is a `UserError` naming the file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import UserError
from .files import CLASSIFIER, DECODER, DECODER_MERGED, DECODER_WITH_PAST, ENCODER, SEARCH_OPS, graph_path, is_export
from .cache import CROSS_BEAMS, PAST_LENGTH, Binding, InPlaceCache
from .cpu import missing_features
from .search import DOCUMENTS, beam_search, candidates, greedy
from .inputs import model_prefix, with_prefix
from .settings import Search, search_from_configs
from .text import _damaged, _first_line, clean_up, read_tokenizer, unknown_past
from .weights import DEQUANTIZE_LINEAR, FLOAT32, WeightFormat


def _ort_cause(error: BaseException, path: Path) -> str:
    """onnxruntime's first line without its prefix and the path the message already names:
    '[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from P failed:Protobuf parsing failed.'"""
    text = _first_line(error).replace("[ONNXRuntimeError] : ", "").replace(f"Load model from {path} failed:", "")
    return re.sub(r"^\d+ : ", "", text).strip()


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON file of the folder ({} when absent)."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _damaged(path, f"not valid JSON: {_first_line(e)}") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or _first_line(e)}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} holds a JSON {type(value).__name__}, expected an object")
    return value


# the export option that writes a folder without each com.microsoft op (modelshrink.onnx.lowbit's kernels)
AVOIDED_BY = {"MatMulNBits": "--kernel float", "DynamicQuantizeMatMul": "--kernel float",
              "MatMulIntegerToFloat": "--kernel float", "GatherBlockQuantized": "--int8",
              "GroupQueryAttention": "--self-attention traced"}
# a merged decoder's branch flag: the same arrays at every step, so that a kept I/O binding binds them once
_WITH_PAST, _FIRST_STEP = np.array([True]), np.array([False])


def _require_ops(needed: list[str], folder: str | os.PathLike) -> None:
    """One line naming the com.microsoft ops the export's graphs use and this onnxruntime lacks, and the export
    option that does without them, before a session fails on them with a message about the graph."""
    import onnxruntime as ort

    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema
    except ImportError:  # a build without schema queries: its own load error says what is missing
        return
    have = {schema.name for schema in get_all_operator_schema() if schema.domain == "com.microsoft"}
    missing = [op for op in needed if op not in have]
    if missing:
        options = sorted({AVOIDED_BY.get(op, "a float32 export (no option)") for op in missing})
        raise UserError(f"{folder} needs onnxruntime's {', '.join(missing)}, which onnxruntime {ort.__version__} lacks; "
                        f"upgrade onnxruntime (1.32 is tested), or export again with {' or '.join(options)}")


def _check_complete(path: Path, folder: str | os.PathLike) -> None:
    """One line for a folder that is not an export, or lacks a file its manifest lists (a generation config or
    tokenizer config would otherwise fall back to defaults without a word); Optimum's folders have no manifest."""
    if not is_export(path):
        raise UserError(f"{folder} is not an export folder (no {ENCODER} or {CLASSIFIER}); "
                        "write one with modelshrink export")
    if not (path / "config.json").is_file():
        raise UserError(f"{folder} is not an export folder (no config.json)")
    listed = _read_json(path / "modelshrink.json").get("files", {})
    missing = sorted(name for name in listed if not (path / name).is_file())
    if missing:
        raise UserError(f"{folder} lacks {', '.join(missing)}, which its modelshrink.json lists; the export is "
                        "incomplete")


def _check_runs_here(resolved: dict[str, Any], folder: str | os.PathLike) -> None:
    """One line where this onnxruntime lacks an op the graphs use, or this processor a feature they need."""
    _require_ops(resolved.get("contrib_ops") or [], folder)
    lacking = missing_features(resolved.get("cpu_features") or [])
    if lacking:
        raise UserError(f"{folder} multiplies int8 weights by uint8 activations (export's s8 kernel), which "
                        f"onnxruntime adds exactly only with {' and '.join(f.upper() for f in lacking)}, and this "
                        "processor lacks it (its sums would clip): export again with --kernel int8")


def _opener(path: Path, config: dict[str, Any], options: Any, folder: str | os.PathLike) -> Callable[[str], Any]:
    """A function that opens one graph of the folder at `path` in an onnxruntime session."""
    import onnxruntime as ort

    def session(name: str) -> Any:
        graph = graph_path(path, name, config)  # beside config.json, or in onnx/ (transformers.js)
        if not graph.is_file():
            raise UserError(f"{folder} has no {graph.relative_to(path)}; the export is incomplete")
        try:
            return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's errors (InvalidProtobuf, Fail, ...) share no base class
            raise _damaged(graph, f"onnxruntime: {_ort_cause(e, graph)}") from None

    return session


def _weight_format(resolved: dict[str, Any], folder: str | os.PathLike) -> WeightFormat:
    """How the graphs store their weights, as the export recorded it (data, or an older export's sentence);
    float32 where it recorded nothing (Optimum's folders)."""
    try:
        return WeightFormat.from_recorded(resolved.get("weights")) or WeightFormat(FLOAT32)
    except ValueError as e:
        raise UserError(f"{folder}'s modelshrink.json records weights this runtime does not read ({e}); a newer "
                        "modelshrink wrote it: upgrade modelshrink") from None


def _session_options(threads: int | None, spin: bool, float_matmuls: bool) -> Any:
    """`float_matmuls`: keep DequantizeLinear + MatMul as they are (a quantize artifact's, or older exports' int8
    initializers)."""
    import onnxruntime as ort

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
    if float_matmuls:
        # onnxruntime would fuse DequantizeLinear + MatMul into an integer matmul that also quantizes the
        # activations, which is not what the quantized model computes; keep the float matmul
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return options


class ExportedModel:
    """An export folder loaded into onnxruntime sessions."""

    def __init__(self, folder: str | os.PathLike, threads: int | None = None, spin: bool = False):
        self.folder = Path(folder)
        _check_complete(self.folder, folder)
        self.config = _read_json(self.folder / "config.json")
        self.generation = _read_json(self.folder / "generation_config.json")
        if not (self.folder / "tokenizer.json").is_file():
            raise UserError(f"{folder} has no tokenizer.json")
        self.tokenizer = read_tokenizer(self.folder / "tokenizer.json")
        self.tokenizer_config = _read_json(self.folder / "tokenizer_config.json")
        self.unknown = unknown_past(self.tokenizer, self.tokenizer_config, self.config)
        # what the export recorded for the runtime (weights, parameters); the manifest once committed
        self.resolved = _read_json(self.folder / "modelshrink.json").get("resolved", {})
        _check_runs_here(self.resolved, folder)
        self.weights = _weight_format(self.resolved, folder)  # how the graphs store their weights
        float_matmuls = self.weights.int8_initializers == DEQUANTIZE_LINEAR or bool(self.resolved.get("quantized_artifact"))
        session = _opener(self.folder, self.config, _session_options(threads, spin, float_matmuls), folder)
        if graph_path(self.folder, ENCODER, self.config).is_file():
            self._load_seq2seq(session)
        elif graph_path(self.folder, CLASSIFIER, self.config).is_file():
            self.classifier = session(CLASSIFIER)
            self.classifier_inputs = {i.name for i in self.classifier.get_inputs()}
            self.task = "classification"
        else:
            raise UserError(f"{folder} holds neither {ENCODER} nor {CLASSIFIER}; the export is incomplete")

    def _load_seq2seq(self, session: Callable[[str], Any]) -> None:
        """The encoder's and decoder's sessions, and what the search needs to know of the decoder's inputs."""
        self.task = "summarization"
        self.prefix = model_prefix(self.config)  # what the model reads before each document (modelshrink.runtime.inputs)
        self.encoder = session(ENCODER)
        self.merged = graph_path(self.folder, DECODER_MERGED, self.config).is_file()
        if self.merged:  # one graph: an If on use_cache_branch between the two decoders
            self.decoder = self.decoder_with_past = session(DECODER_MERGED)
        else:
            self.decoder, self.decoder_with_past = session(DECODER), session(DECODER_WITH_PAST)
        inputs = {i.name: i.shape for i in self.decoder_with_past.get_inputs()}
        self.past_names = [n for n in inputs if n.startswith("past")]
        # inputs shared by a document's beams (modelshrink.onnx.fuse): beam search keeps one row per document
        self.per_document = frozenset(n for n in self.past_names if inputs[n] and inputs[n][0] == DOCUMENTS)
        # the static axes (heads, head size, width) of the inputs that a merged decoder's other branch ignores
        self._static = {n: [d if isinstance(d, int) else 0 for d in shape] for n, shape in inputs.items()}
        self._empties: dict[tuple[str, int], np.ndarray] = {}
        # a decoder whose self-attention writes its cache in place (modelshrink.onnx.self_attention)
        self.cache_in_place = PAST_LENGTH in {i.name for i in self.decoder_with_past.get_overridable_initializers()}
        # the rows a document for which its cross-attention reads each document's own length (0: none)
        meta = self.decoder_with_past.get_modelmeta().custom_metadata_map
        self.cross_beams = int(meta.get(CROSS_BEAMS, 0)) if self.cache_in_place else 0
        self.output_names = {"first": [o.name for o in self.decoder.get_outputs()],
                             "past": [o.name for o in self.decoder_with_past.get_outputs()]}
        self.search = search_from_configs(self.config, self.generation)
        self.search_ops = session(SEARCH_OPS) if graph_path(self.folder, SEARCH_OPS).is_file() else None

    # ------------------------------------------------------------ text in and out

    @property
    def max_source_length(self) -> int:
        """The smaller of the tokenizer's model_max_length and the model's positions (as every step)."""
        limits = []
        limit = self.tokenizer_config.get("model_max_length")
        if isinstance(limit, (int, float)) and limit < 100_000:
            limits.append(int(limit))
        for holder in (self.config, self.config.get("encoder", {})):
            if holder.get("max_position_embeddings"):
                limits.append(int(holder["max_position_embeddings"]))
                break
        return min(limits) if limits else 1024

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
        if self.unknown is not None:  # a piece the model has no row for reads as <unk>
            ids[ids >= self.unknown[0]] = self.unknown[1]
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def decode(self, ids: np.ndarray) -> list[str]:
        texts = self.tokenizer.decode_batch([row.tolist() for row in ids], skip_special_tokens=True)
        if self.tokenizer_config.get("clean_up_tokenization_spaces"):
            texts = [clean_up(t) for t in texts]
        return [t.strip() for t in texts]

    # ------------------------------------------------------------ summarization

    def settings(self, **overrides: Any) -> Search:
        return replace(self.search, **{k: v for k, v in overrides.items() if v is not None})

    def summarize(self, documents: list[str], batch_size: int = 16, max_source_length: int | None = None,
                  **overrides: Any) -> list[str]:
        settings = self.settings(**overrides)
        out: list[str] = []
        for start in range(0, len(documents), batch_size):
            enc = self.encode(with_prefix(documents[start:start + batch_size], self.prefix),
                              max_length=max_source_length)
            out += self.decode(self.generate_ids(enc["input_ids"], enc["attention_mask"], settings))
        return out

    def _encoder(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The encoder's states [batch, width, d], run on groups of documents of similar length.

        A padded position costs the encoder as much as a real one: 16 Debian documents (mean 84 BPE
        tokens, the longest 267) were two thirds padding at batch 16. Each group is cut to its own
        longest document; the positions beyond a document's length are zero, and every later use masks
        them out (the cross-attention weights of masked positions are exactly 0)."""
        lengths = attention_mask.sum(axis=1)
        groups = length_groups(lengths)
        if len(groups) == 1:
            return self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]
        hidden = None
        for rows in groups:
            width = int(lengths[rows].max())
            part = self.encoder.run(None, {"input_ids": np.ascontiguousarray(input_ids[rows, :width]),
                                           "attention_mask": np.ascontiguousarray(attention_mask[rows, :width])})[0]
            if hidden is None:
                hidden = np.zeros((*input_ids.shape, part.shape[-1]), dtype=part.dtype)
            hidden[rows, :width] = part
        return hidden

    def _empty(self, name: str, batch: int) -> np.ndarray:
        """What a merged decoder is fed for an input only its other branch reads: `batch` rows, every other dynamic
        axis (source, past length) empty; the same array for the same rows, so that a kept binding keeps it."""
        key = (name, batch)
        if key not in self._empties:
            shape = list(self._static[name])
            shape[0] = batch
            self._empties[key] = np.zeros(shape, dtype=np.float32)
        return self._empties[key]

    def run_decoder(self, feed: dict[str, np.ndarray], with_past: bool, into: dict[str, np.ndarray] | None = None,
                    binding: Binding | None = None) -> dict[str, np.ndarray]:
        """One decoder call, first step or with past (feed: that graph's inputs); every output by name.
        With a merged decoder, the inputs only the other branch reads are fed empty. The outputs named in
        `into` are written into those (C-contiguous) arrays, which may also be inputs: onnxruntime's
        GroupQueryAttention then writes its one new cache position in place (runtime/cache.py); `binding`
        (of the decoder with past, with `into`) is the I/O binding kept from the search's last step."""
        session = self.decoder_with_past if with_past else self.decoder
        names = self._output_names(with_past)
        if self.merged:
            feed = dict(feed, use_cache_branch=_WITH_PAST if with_past else _FIRST_STEP)
            batch = feed["input_ids"].shape[0]
            for name in self._static:
                if name not in feed:
                    feed[name] = self._empty(name, batch)
        # with past, the cross-attention's keys and values stay the first step's: a merged decoder's and a fused
        # cross-attention's presents are empty, or written in place into what the caller fed
        def kept(name: str) -> bool:
            return not (with_past and ".encoder." in name)

        if into is None:
            out = dict(zip(names, session.run(None, feed)))
        else:
            out = (binding or Binding(session, names)).run(feed, into, wanted=kept)
        return {n: v for n, v in out.items() if kept(n)}

    def _output_names(self, with_past: bool) -> list[str]:
        return self.output_names["past" if with_past and not self.merged else "first"]

    def decoder_binding(self) -> Binding:
        """An I/O binding of the decoder with past, for a search to keep from step to step (`run_decoder`)."""
        return Binding(self.decoder_with_past, self._output_names(with_past=True))

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
        """Token ids [batch, length] starting with the decoder start token, as `model.generate` returns them.
        The sources are right-padded, as `encode` pads them."""
        settings = settings or self.search
        lengths = attention_mask.sum(axis=1)
        if self.cross_beams and (attention_mask != (np.arange(attention_mask.shape[1]) < lengths[:, None])).any():
            # the fused cross-attention reads each source up to its length (modelshrink.onnx.cross_attention)
            raise UserError("attention_mask must be right-padded (1s, then 0s), as ExportedModel.encode pads")
        hidden = self._encoder(input_ids, attention_mask)
        first, following = self._first_step, self._next_step
        if self.cache_in_place:  # the self-attention cache in buffers written in place (runtime/cache.py)
            cache = InPlaceCache(self, capacity=settings.max_length)
            first, following = cache.first_step, cache.next_step
        if settings.num_beams > 1:
            return beam_search(first, following, self.search_ops, hidden, attention_mask, settings, self.per_document)
        return greedy(first, following, hidden, attention_mask, settings)

    def _candidates(self, logits: np.ndarray, flat: np.ndarray, running_scores: np.ndarray, keep: int,
                    s: Search) -> tuple[np.ndarray, np.ndarray]:
        """Beam search's ranking of one step with this folder's search_ops session (see search.candidates)."""
        return candidates(self.search_ops, logits, flat, running_scores, keep, s)

    def parameter_count(self) -> int:
        """Values held by the graphs' initializers, as `modelshrink export` counted them (modelshrink.json).
        A folder written before the export recorded the count is counted here, which needs the onnx package."""
        if "parameters" in self.resolved:
            return int(self.resolved["parameters"])
        import onnx  # only for such older folders: the runtime's own dependencies do not include it

        names = [ENCODER, DECODER_MERGED if self.merged else DECODER] if self.task == "summarization" \
            else [CLASSIFIER]
        total = 0
        for name in names:
            for init in onnx.load(str(graph_path(self.folder, name, self.config)),
                                  load_external_data=False).graph.initializer:
                total += int(np.prod(init.dims)) if len(init.dims) else 1
        return total

    # ------------------------------------------------------------ classification

    def logits(self, texts: list[str], pairs: list[str] | None = None, max_length: int | None = None) -> np.ndarray:
        enc = self.encode(texts, pairs, max_length)
        return self.classifier.run(None, {k: v for k, v in enc.items() if k in self.classifier_inputs})[0]

    def classify(self, texts: list[str], pairs: list[str] | None = None, batch_size: int = 32) -> list[Any]:
        """Class ids, or values for a one-output (regression) head, as `modelshrink.training.classify.predict`."""
        out: list[Any] = []
        for start in range(0, len(texts), batch_size):
            logits = self.logits(texts[start:start + batch_size],
                                 pairs[start:start + batch_size] if pairs else None)
            out += [float(x) for x in logits[:, 0]] if logits.shape[-1] == 1 else [int(x) for x in logits.argmax(-1)]
        return out


def length_groups(lengths: np.ndarray, slack: float = 1.25) -> list[np.ndarray]:
    """Rows in groups of similar length (shortest first), each group's padded size (rows x its longest)
    at most `slack` x its real tokens, so that padding costs at most a quarter more than the tokens.
    Rows of one length, or a batch of one, stay one group."""
    order = np.argsort(lengths, kind="stable")
    groups, start, real = [], 0, 0
    for at, row in enumerate(order):
        real += int(lengths[row])
        if (at + 1 - start) * int(lengths[row]) > slack * real:  # the new, longest row would make it too wasteful
            groups.append(order[start:at])
            start, real = at, int(lengths[row])
    groups.append(order[start:])
    return [np.sort(g) for g in groups]


def load(folder: str | os.PathLike, threads: int | None = None, spin: bool = False) -> ExportedModel:
    """An export folder in onnxruntime sessions with `threads` intra-op threads each (default: the usable
    cores); `spin=True` lets their threads busy-wait between runs (onnxruntime's default, slower here).
    Torch-free; `modelshrink.load` is this function, and `modelshrink run` its command line.

    ```python
    import modelshrink  # without torch: from modelshrink.runtime import load

    model = modelshrink.load("student-onnx")
    print(model.summarize(["a long document ..."], batch_size=16))
    ```
    """
    return ExportedModel(folder, threads, spin)
