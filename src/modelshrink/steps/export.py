"""`export`: a model artifact as ONNX graphs that a service runs with onnxruntime alone.

The step: check the model, trace its graphs (`modelshrink.onnx.graphs`), rewrite them for size
(`compress`: a `quantize` artifact's integer weights, each at its own width; `int8`: `--int8`; `int4`: `--int4`;
`merge`: the two decoders as one decoder_model_merged.onnx, a tied output projection stored once),
validate them against PyTorch (`validate`), write config, tokenizer and model card beside them, commit.
The folder keeps Optimum's file names, so existing tooling (Optimum's `ORTModelForSeq2SeqLM`, our
`modelshrink.runtime`) recognizes it.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink.artifacts import ArtifactWriter, parent_ref, read_manifest
from modelshrink.cards import commit_model
from modelshrink.errors import UserError
from modelshrink.families import CLASSIFIER_TYPES, TOKEN_TYPE_CLASSIFIERS, model_kind
from modelshrink.runtime.inputs import model_prefix, with_prefix
from modelshrink.models.fast_tokenizers import fast_form
from modelshrink.models.fit import embedding_rows
from modelshrink.onnx import lowbit
from modelshrink.onnx.compress import compact_quantized, keep_low_bits
from modelshrink.onnx.cross_attention import fuse_cross_attention
from modelshrink.onnx.fuse import fuse_decoder_with_past
from modelshrink.onnx.graphs import export_classifier, export_seq2seq, parameter_count, use_eager_attention
from modelshrink.onnx.int4 import quantize_int4
from modelshrink.onnx.int8 import quantize_int8
from modelshrink.onnx.kernels import KernelChoice
from modelshrink.onnx.layout import apply_layout, check_layout
from modelshrink.onnx.merge import merge_decoders, store_tied_once
from modelshrink.onnx.saving import finish_graph, graph_bytes, staged
from modelshrink.onnx.self_attention import fuse_self_attention
from modelshrink.onnx.validate import (FLOAT_ATOL, INT4_RTOL, INT8_RTOL, QUANTIZED_RTOL, ExportCheckFailed, Reference,
                                       reference, validate)
from modelshrink.options.export import ExportOptions
from modelshrink.quant.model import is_quantized
from modelshrink.quant.spec import code_threshold
from modelshrink.runtime.cpu import VNNI, signed_products_exact
from modelshrink.runtime.files import DECODER_MERGED, DECODER_WITH_PAST, ENCODER
from modelshrink.runtime.weights import CAST_MUL, FLOAT32, INT4, INT8, QUANTIZED, WeightFormat

__all__ = ["ExportCheckFailed", "ExportOptions", "export_model", "inspect"]

LogFn = Callable[[str], None]


def inspect(spec: str, trust_remote_code: bool = False, allow_pickle: bool = False) -> tuple[str, Any]:
    """('seq2seq' | 'classifier', the model resolved once: `models.loading.ModelSource`); one-line errors for
    anything without an export path."""
    from modelshrink.models.loading import resolve

    path = Path(spec)
    if path.is_dir() and not (path / "config.json").is_file():
        manifest = read_manifest(path)
        what = f"a {manifest['kind']} artifact (step {manifest['step']})" if manifest else "a folder without config.json"
        raise UserError(f"{spec} is not a model: it is {what}; expected a model artifact or save_pretrained folder")
    source = resolve(spec, "model", trust_remote_code, allow_pickle)
    config = source.config
    kind = model_kind(config)  # a UserError naming the supported families for another encoder-decoder
    if kind is not None:
        return kind, source
    raise UserError(f"no export path for model type '{config.model_type}' "
                    f"({', '.join(config.architectures or []) or 'no architecture'}); supported: seq2seq families "
                    f"and sequence classifiers of type {', '.join(CLASSIFIER_TYPES)}")


def _sample_texts(options: ExportOptions, tokenizer: Any, count: int, seq2seq: Any = None) -> list[str]:
    """Documents to validate with: from --data, else made of the tokenizer's own words; a seq2seq model's (its
    config `seq2seq`) behind its task prefix, as the runtime reads them (modelshrink.runtime.inputs)."""
    if seq2seq is not None:
        return with_prefix(_sample_texts(options, tokenizer, count), model_prefix(seq2seq))
    if options.data is not None:
        from modelshrink.data import examples, open_data, pick_columns

        source = open_data(options.data)
        text_column, _ = pick_columns(source.columns, options.text_column, source=options.data)
        texts = [example.document for example in examples(source, text_column, limit=count)]
        if not texts:
            raise UserError(f"data {options.data} has no rows")
        return texts
    special = set(tokenizer.all_special_tokens)
    words = [w for w, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]) if w not in special
             and w.isalpha()][:2000] or ["hello", "world"]
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(words, size=4 + 5 * i)) for i in range(count)]


def _load_model(options: ExportOptions) -> tuple[str, Any, Any, Any]:
    """(kind, config, model with eager attention, tokenizer); one-line errors before anything is written."""
    from modelshrink.models.loading import load_classifier, load_seq2seq

    kind, source = inspect(options.model, options.trust_remote_code, options.allow_pickle)
    local = Path(options.model)
    if local.is_dir() and not any((local / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        raise UserError(f"{options.model} has no tokenizer (tokenizer.json); an export folder must be complete, so "
                        "save the tokenizer beside the model first")
    source.tokenizer()  # a missing tokenizer fails here, before the weights load
    if kind == "seq2seq":
        model, tokenizer, _ = load_seq2seq(source)
    else:
        model, tokenizer = load_classifier(source)
    use_eager_attention(model)
    return kind, source.config, model, tokenizer


def rounding_for(activation_rounding: str) -> str:
    """`--activation-rounding` as `keep_low_bits` takes it: auto is kernel (BENCHMARKS.md, lowbit: the integer
    kernels' own rounding made 2-2-8, 4-4-8 and 8-8-8 the fastest forms at batch 1 and 16 on an AVX-512 VNNI
    machine, 2-2-8 on an AVX2 one too)."""
    return "kernel" if activation_rounding == "auto" else activation_rounding


def _rewrite(folder: Path, kind: str, graphs: list[str], options: ExportOptions, quantized: dict[str, Any] | None,
             log: LogFn, beams: int = 1) -> tuple[list[str], dict[str, Any]]:
    """Int8 weights, the merged decoder, tied weights stored once; returns (the graphs now, what each saved).
    `beams`: the generation config's num_beams, the rows a document of the fused cross-attention's fast path."""
    storage: dict[str, Any] = {}
    measured: dict = {}  # kernel timings, shared by graphs of the same rows
    if quantized is not None and not options.int8:
        # with --int8 the dynamic quantization stores every matmul weight and table in 8 bits itself (and
        # multiplies in integers); its integer matmuls need the weight itself, not a Cast and Mul that compute it
        # every width the artifact's tensors use (a mixed map has several): each weight is found at the smallest
        thresholds = {code_threshold(info["bits"]) for info in quantized["tensors"].values()}
        for name in graphs:
            storage[name] = keep_low_bits(folder / name, thresholds, _kernels(name, options, measured),
                                          rounding_for(options.activation_rounding))
            storage[name].update(compact_quantized(folder / name, thresholds))
            log(f"{name}: {storage[name]['low_bit_matmuls']} matmuls and {storage[name]['low_bit_tables']} tables "
                f"in their own bits ({_kernel_counts(storage[name]['low_bit_kernels'])}), "
                f"{storage[name]['int8_initializers']} other weights in int8")
    if options.int8:
        for name in graphs:
            storage[name] = quantize_int8(folder / name, options.per_channel, _kernels(name, options, measured))
            log(f"int8: {storage[name]['int8_matmuls']} matmuls and {storage[name]['int8_tables']} embedding tables "
                f"of {name} in 8 bits ({_kernel_counts(storage[name]['int8_kernels'])})")
    if options.int4:
        for name in graphs:
            storage[name] = quantize_int4(folder / name, options.int4_block_size, _kernels(name, options, measured),
                                          options.int4_embeddings)
            log(f"int4: {storage[name]['int4_matmuls']} matmuls and {storage[name]['int4_tables']} embedding tables "
                f"of {name} in 4 bits (block {options.int4_block_size}; "
                f"{_kernel_counts(storage[name]['int4_kernels'])})")
    if kind == "seq2seq":  # cross-attention keys and values once per document, not per beam (onnx/fuse.py)
        storage["fused"] = fuse_decoder_with_past(folder / DECODER_WITH_PAST)
        if options.self_attention == "fused":  # the cache written in place (onnx/self_attention.py)
            storage["fused"].update(fuse_self_attention(folder / DECODER_WITH_PAST))
            why = storage["fused"].get("self_attention_traced")
            log(f"self-attention: {storage['fused']['self_attention_layers']} layers as GroupQueryAttention, the cache "
                "written in place" if not why else f"self-attention kept as traced: {why}")
            if options.merge:  # each document's own source length (onnx/cross_attention.py); needs the merged If
                storage["fused"].update(fuse_cross_attention(folder / DECODER_WITH_PAST, beams))
                why = storage["fused"].get("cross_attention_traced")
                log(f"cross-attention: {storage['fused']['cross_attention_layers']} layers as GroupQueryAttention "
                    f"over each document's length at beam {beams}" if not why
                    else f"cross-attention kept as traced: {why}")
    if kind == "seq2seq" and options.merge:
        storage["merged"] = merge_decoders(folder)
        graphs = [ENCODER, DECODER_MERGED]
        log(f"merged the two decoders into {DECODER_MERGED} ({storage['merged']['shared']} of the "
            f"{storage['merged']['initializers']} initializers were the same weight in both)")
    if not options.int8:
        for name in graphs:
            tied = store_tied_once(folder / name)
            if tied["tied"]:
                storage.setdefault(name, {}).update(tied)
    return graphs, storage


def _kernels(graph: str, options: ExportOptions, measured: dict) -> KernelChoice:
    """The kernel choice for one graph: the decoder steps share their weights with the first step (merged into one
    graph), so every decoder graph is measured at a decoder step's rows, once (`measured` is shared). A folder for
    transformers.js runs where no modelshrink.json is read, so on no processor that the runtime's check would keep
    from s8's clipped sums: left to choose, it takes the kernels that are exact everywhere."""
    available = lowbit.available_kernels()
    if options.layout == "transformers.js":
        available = tuple(k for k in available if k != lowbit.S8)
    return KernelChoice(graph, options.kernel, available=available, measured=measured)


def _kernel_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} on {kernel}" for kernel, n in sorted(counts.items())) or "no matmul"


def _check_kernels(options: ExportOptions, kind: str, quantized: dict[str, Any] | None) -> None:
    """The options that ask for weights, kernels and rounding this model or this processor cannot give, refused in
    one line before anything is written."""
    if quantized and options.int4:
        raise UserError(f"--int4 applies to float models: {options.model} is a quantize artifact "
                        f"({quantized['bits']}), and exporting a quantized artifact keeps its own bits")
    if options.kernel != "auto" and not (options.int4 or options.int8 or quantized):
        raise UserError(f"--kernel applies to low-bit weights: {options.model} is a float model; add --int8 or "
                        "--int4, or export a quantize artifact")
    if options.activation_rounding != "auto" and not quantized:
        raise UserError(f"--activation-rounding applies to a quantize artifact: {options.model} is a float model, "
                        "whose activations are not rounded")
    if kind == "classifier" and options.self_attention != "fused":
        raise UserError(f"--self-attention applies to a seq2seq model's decoder: {options.model} is a classifier, "
                        "which has none")
    if options.int4 or (quantized and not options.int8):
        what = "--int4" if options.int4 else f"exporting a {quantized['bits']} artifact"
        lowbit.require_support(what, {lowbit.FLOAT} if options.kernel == "auto" else {options.kernel},
                               avoid="--int8" if options.kernel in ("auto", "float") else "--kernel float")
    if options.int8 and options.kernel in (lowbit.NBITS, lowbit.S8):  # the uint8 kernel is onnxruntime's own form
        lowbit.require_support(f"--int8 --kernel {options.kernel}", {options.kernel}, avoid="--kernel int8")
    if options.kernel == lowbit.S8 and not signed_products_exact():
        raise UserError("--kernel s8 multiplies uint8 activations by int8 weights, which onnxruntime adds exactly only "
                        "on x86 with VNNI (avx512_vnni, avx_vnni or amx_int8 in /proc/cpuinfo) or on ARM, and this "
                        "processor has none: use --kernel int8, or export on the kind of machine that serves")


def export_model(options: ExportOptions, output: str | Path, *, overwrite: bool = False,
                 log: LogFn = lambda m: None) -> tuple[Path, dict[str, Any]]:
    """Write the export folder; returns (path, report). A failed check raises `ExportCheckFailed`
    after the folder and its report are written. The function behind `modelshrink export` (as
    `modelshrink.export`).

    ```python
    import modelshrink
    from modelshrink import ExportOptions

    options = ExportOptions(model="student", int8=True)
    folder, report = modelshrink.export(options, "student-onnx")
    print(modelshrink.load(folder).summarize(["a long document ..."]))
    ```
    """
    writer = ArtifactWriter(output, overwrite=overwrite)
    writer.check()
    kind, config, model, tokenizer = _load_model(options)
    check_layout(options.layout, kind, config, options.merge)
    quantized = dict(config.quantization_config) if is_quantized(config) else None
    _check_kernels(options, kind, quantized)
    max_source_length, texts, enc = _inputs(options, kind, model.config, tokenizer)
    with writer:
        folder = writer.staging
        log(f"exporting {kind} {options.model} to ONNX (opset {options.opset})")
        with staged():  # every graph in the data-file form until finished (onnx/saving.py: memory)
            graphs = (export_seq2seq if kind == "seq2seq" else export_classifier)(model, folder, enc, options.opset)
            beams = int(getattr(getattr(model, "generation_config", None), "num_beams", 1) or 1)
            _write_companions(model, tokenizer, folder, kind)
            expected = _reference(options, model, tokenizer, kind, texts, max_source_length, enc, quantized)
            del model  # from here on the graphs, not the model, are in memory (validate.Reference)
            gc.collect()
            graphs, storage = _rewrite(folder, kind, graphs, options, quantized, log, beams)
        for name in graphs:
            finish_graph(folder / name)
        weights = _weights(options, quantized, storage)
        graphs = apply_layout(folder, graphs, options.layout, weights)
        resolved = {"kind": kind, "graphs": graphs, "layout": options.layout, "max_source_length": max_source_length,
                    "quantized_artifact": quantized["bits"] if quantized else None,
                    "weights": weights.recorded(), "contrib_ops": contrib_ops(folder, graphs),
                    "cpu_features": cpu_features(storage),
                    # packed initializers hold two codes a byte: count the weights, not the bytes
                    "parameters": parameter_count(folder, graphs) + sum(
                        s.get(f"{p}_values", 0) - s.get(f"{p}_stored_values", 0) for n, s in storage.items()
                        for p in ("int4", "low_bit") if n != DECODER_WITH_PAST)}
        if options.int4:
            resolved["int4"] = {"bits": 4, "block_size": options.int4_block_size, "zero_points": True,
                                "embeddings": "4-bit (GatherBlockQuantized) where the width is a multiple of the block"
                                if options.int4_embeddings else "float32",
                                "tables_converted": {n: s["int4_tables"] for n, s in storage.items() if "int4_tables" in s},
                                "matmuls_converted": {
                                    n: s["int4_matmuls"] for n, s in storage.items() if "int4_matmuls" in s}}
        (folder / "modelshrink.json").write_text(json.dumps({"resolved": resolved}))  # the runtime reads it
        report: dict[str, Any] = {"kind": kind, "graphs": graphs, "opset": options.opset, "int8": options.int8,
                                  "int4": options.int4_block_size if options.int4 else None,
                                  "per_channel": options.per_channel, "storage": storage,
                                  "bytes": {n: graph_bytes(folder / n) for n in graphs}}
        failure = None
        if options.validate:
            rtol = INT8_RTOL if options.int8 else INT4_RTOL if options.int4 else (QUANTIZED_RTOL if quantized else None)
            atol = options.atol if options.atol is not None else (None if rtol else FLOAT_ATOL)
            log(f"validating against PyTorch on {len(texts)} documents")
            check = validate(expected, folder, atol=atol, rtol=rtol, rms=options.int8 or options.int4 or bool(quantized),
                             scaled=options.atol is None, log=log)
            report["validation"] = check
            failure = check.get("failure")
        (folder / "export_report.json").write_text(json.dumps(report, indent=2) + "\n")
        _model_card(folder, options, report)
        metrics = {"validated": options.validate, "passed": failure is None if options.validate else None}
        if options.validate:
            metrics["max_abs_diff"] = report["validation"]["max_abs_diff"]
            for key in ("generation", "predictions"):
                if key in report["validation"]:
                    metrics[f"{key}_agreement"] = report["validation"][key]["agreement"]
        path = commit_model(writer, step="export", options=options.recorded(),
                            parents=[parent_ref("model", options.model)], metrics=metrics, resolved=resolved)
    if failure:
        raise ExportCheckFailed(failure, str(path))
    return path, report


def cpu_features(storage: dict[str, Any]) -> list[str]:
    """The processor features the graphs need to compute exactly, which the runtime checks before loading them:
    VNNI where a matmul runs on the s8 kernel (`modelshrink.runtime.cpu`)."""
    used = {kernel for s in storage.values() if isinstance(s, dict)
            for key in ("int8_kernels", "low_bit_kernels") for kernel, n in s.get(key, {}).items() if n}
    return [VNNI] if lowbit.S8 in used else []


def contrib_ops(folder: Path, graphs: list[str]) -> list[str]:
    """The com.microsoft ops the graphs use: what the runtime checks its onnxruntime for before loading them."""
    import onnx

    found: set[str] = set()

    def visit(graph: Any) -> None:
        for node in graph.node:
            if node.domain == lowbit.DOMAIN:
                found.add(node.op_type)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    visit(sub)

    for name in graphs:
        visit(onnx.load(str(folder / name), load_external_data=False).graph)
    return sorted(found)


def _weights(options: ExportOptions, quantized: dict[str, Any] | None, storage: dict[str, Any]) -> WeightFormat:
    """How the graphs store their weights, as modelshrink.json records it for the runtime and readers."""
    if options.int8:
        return WeightFormat(INT8, (8,))
    if options.int4:
        return WeightFormat(INT4, (4,))
    if quantized is None:
        return WeightFormat(FLOAT32)
    widths = tuple(sorted({bits for s in storage.values() for bits in s.get("low_bit_widths", [])}))
    # without low-bit codes every integer weight is an int8 initializer (compact_quantized)
    scaled = not widths or any(s.get("int8_initializers") for s in storage.values())
    return WeightFormat(QUANTIZED, widths, CAST_MUL if scaled else None)


def _inputs(options: ExportOptions, kind: str, config: Any, tokenizer: Any) -> tuple[int, list[str], dict[str, Any]]:
    """(the source length, the check's documents, the two the graphs are traced with, tokenized)."""
    from modelshrink.models.loading import source_length

    max_source_length = source_length(options.max_source_length, tokenizer, config)
    texts = _sample_texts(options, tokenizer, max(options.samples, 2), config if kind == "seq2seq" else None)
    enc = dict(tokenizer(texts[:2], truncation=True, max_length=max_source_length, padding=True, return_tensors="pt"))
    if kind == "classifier" and "token_type_ids" not in enc and config.model_type in TOKEN_TYPE_CLASSIFIERS:
        enc["token_type_ids"] = torch.zeros_like(enc["input_ids"])
    return max_source_length, texts, enc


def _reference(options: ExportOptions, model: Any, tokenizer: Any, kind: str, texts: list[str], max_source_length: int,
               enc: dict[str, Any], quantized: dict[str, Any] | None) -> Reference | None:
    """PyTorch's side of the check, computed before the export frees the model (None without --validate); a
    quantized model's float64 twin converts the model in place."""
    if not options.validate:
        return None
    return reference(model, tokenizer, kind, texts, max_source_length, generation_docs=options.generation_docs,
                     float_rounding=bool(quantized) and options.atol is None,  # the bound of a model that rounds
                     classifier_inputs=tuple(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in enc))


def _write_companions(model: Any, tokenizer: Any, folder: Path, kind: str) -> None:
    """config.json (without modelshrink's quantization entry: the graphs hold the weights), generation
    config and tokenizer files, so that the folder is complete on its own."""
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if kind == "seq2seq" and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rows = embedding_rows(model.config) or 0
    if not (folder / "tokenizer.json").is_file() and (converted := fast_form(tokenizer, rows)) is not None:
        (folder / "tokenizer.json").write_text(converted, encoding="utf-8")
    if not (folder / "tokenizer.json").is_file():
        raise UserError(f"the model's tokenizer ({type(tokenizer).__name__}) has no fast (tokenizer.json) form, which "
                        "the torch-free runtime needs")
    _portable_tokenizer_class(folder / "tokenizer_config.json")


# transformers 5 saves a fast tokenizer as its generic class, which transformers 4 (the environment of Optimum's
# ORTModel clients) does not have: its AutoTokenizer stops with "Tokenizer class TokenizersBackend does not exist"
GENERIC_TOKENIZER = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def _portable_tokenizer_class(path: Path) -> None:
    """Name the generic fast tokenizer by the class both transformers 4 and 5 load from tokenizer.json
    (PreTrainedTokenizerFast; transformers 5 maps it to the same backend), so that Optimum's users can run
    AutoTokenizer on the folder."""
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") in GENERIC_TOKENIZER:
        config["tokenizer_class"] = GENERIC_TOKENIZER[config["tokenizer_class"]]
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _model_card(folder: Path, options: ExportOptions, report: dict[str, Any]) -> None:
    check = report.get("validation", {})
    lines = [f"# ONNX export of `{Path(options.model).name}`", "",  # the commit adds the Hub's metadata
             f"Exported by `modelshrink export` from `{options.model}` (opset {options.opset}"
             f"{', int8 weights' if options.int8 else ''}"
             f"{f', int4 weights in blocks of {options.int4_block_size}' if options.int4 else ''}).", "",
             "Graphs: " + ", ".join(f"`{g}` ({report['bytes'][g] / 1e6:.1f} MB)" for g in report["graphs"]) + ".", "",
             "Run it without torch:", "", "```python", "from modelshrink.runtime import load",
             f"model = load(\"{folder.name if folder.name[0] != '.' else 'THIS_FOLDER'}\")",
             "print(model.summarize([\"a document\"]))" if report["kind"] == "seq2seq" else
             "print(model.classify([\"a sentence\"]))", "```", ""]
    if check:
        lines += ["## Validation against PyTorch", "",
                  f"Largest absolute difference over all outputs: {check['max_abs_diff']:.3g} "
                  f"(tolerance: {check['tolerance']}).", ""]
        if "generation" in check:
            g = check["generation"]
            lines += [f"Generated tokens equal to PyTorch's: {g['agreement']}.", ""]
    (folder / "README.md").write_text("\n".join(lines))
