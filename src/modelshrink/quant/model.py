"""Quantized artifacts that are small on disk: integers, not fake-quantized floats.

`modelshrink-quantized.safetensors` holds, for every quantized weight, `NAME.qweight` (the integers packed: int8 at
8 bits, two per byte at 3-4 bits, five ternary digits per byte at 2 bits) and `NAME.scale` (α, per tensor or per
row, float32); every other tensor (learned positional embeddings unless a rule quantizes them, norms, biases) as it
was, except tables the architecture computes from their shape (Marian's and Pegasus' sinusoidal positions, 26% of a
2-2-8 Marian-shaped student): those are left out and made again on load (`recomputed_tables`).
config.json carries `quantization_config` (quant_method "modelshrink", the bits, the granularity,
the packing, and each quantized tensor's shape and bits), enough to rebuild the model. A model with per-layer bits
(`--bits 2-2-8,cross_attention=8`, `--budget-mb`) is format 2 (3 where a rule names one stack's word embeddings,
`encoder.embeddings=2`, or position tables, `positions=8`): its config also lists the rules and each group's bits,
and a reader refuses any format newer than its own.

Plain `transformers.from_pretrained` cannot read this: it finds no weights file it knows and fails
(a file named model.safetensors would instead be loaded half-empty, with random weights).
`load_quantized` (used by every modelshrink command) rebuilds the architecture from the config,
unpacks and dequantizes the weights (α·b, exactly the values the quantized model computed with),
and re-applies activation and attention quantization.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from modelshrink.errors import UserError
from modelshrink.families import ENCODER_DECODER_TYPE
from modelshrink.quant.groups import bits_by_group
from modelshrink.quant.modules import check_quantizable, latent_weights, quantize_model
from modelshrink.quant.spec import QuantSpec, Selector
from modelshrink.quant.packing import BITS_PER_VALUE, pack, unpack
from modelshrink.quant.quantizers import dequantize, quantize_weight

QUANT_METHOD = "modelshrink"
# Not "model.safetensors": transformers would load that file, skip every packed tensor as unexpected
# and start from random weights with only a warning. Under this name a plain load finds no weights
# and fails loudly.
WEIGHTS_NAME = "modelshrink-quantized.safetensors"
# 1: one W-E-A for every layer (no `format_version` key); 2: per-layer bits (`rules`, `groups`); 3: as 2, with a
# rule for one stack's own word embeddings (`encoder.embeddings=2`) or for position tables (`positions=8`), which a
# reader of 2 cannot parse. Each artifact has the lowest format that holds it; a reader refuses a newer format in
# one line rather than misreading it.
FORMAT_VERSION = 3


def format_of(spec: QuantSpec) -> int:
    """The format an artifact quantized under `spec` is written in (1 is written without the key)."""
    if not spec.mixed:
        return 1
    selectors = [Selector.parse(s) for s, _ in spec.rules]
    return 3 if any(s.kind == "positions" or (s.kind == "embeddings" and s.stack) for s in selectors) else 2


def is_quantized(config: Any) -> bool:
    """Whether a model is a modelshrink-quantized artifact (integers on disk, which plain `from_pretrained` cannot
    read), from its config: a transformers config or config.json read as a dict. The one answer every reader asks."""
    qc = config.get("quantization_config") if isinstance(config, dict) else getattr(config, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return method == QUANT_METHOD


def _plain_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with parametrized weights under their ordinary names (latent values)."""
    state = {}
    for key, value in model.state_dict().items():
        state[key.replace("parametrizations.", "").replace(".original", "")] = value
    return state


def stored_tensors(model: torch.nn.Module, *, codes: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What the weights file holds: (tensors by name, each quantized tensor's shape and bits). With codes=False the
    packed codes and scales are zero placeholders of their exact sizes, to predict the file's size cheaply."""
    from modelshrink.quant.packing import packed_bytes

    quantized = latent_weights(model)
    tensors: dict[str, torch.Tensor] = {}
    shapes: dict[str, dict[str, Any]] = {}
    for name, (latent, bits, per_row) in quantized.items():
        if codes:
            b, alpha = quantize_weight(latent.detach().float().cpu(), bits, per_row)
            tensors[f"{name}.qweight"] = pack(b.flatten(), bits)
            tensors[f"{name}.scale"] = alpha.float().reshape(-1).contiguous()
        else:
            tensors[f"{name}.qweight"] = torch.zeros(packed_bytes(latent.numel(), bits), dtype=torch.uint8)
            tensors[f"{name}.scale"] = torch.zeros(latent.shape[0] if per_row else 1, dtype=torch.float32)
        shapes[name] = {"shape": list(latent.shape), "bits": bits, "per_row": per_row}
    seen_data: set[int] = {latent.data_ptr() for latent, _, _ in quantized.values()}
    recomputed = set(recomputed_tables(model))
    for name, value in _plain_state(model).items():
        if name in quantized or value.data_ptr() in seen_data or name in recomputed:  # tied copies, fixed tables
            continue
        tensors[name] = value.detach().cpu().contiguous()
        seen_data.add(value.data_ptr())
    return tensors, shapes


# one metadata key: safetensors writes several in a random order, so equal runs would differ in bytes
_METADATA = {"format": "pt"}


def predicted_bytes(model: torch.nn.Module) -> int:
    """The exact size of the weights file `save_quantized` would write for this model as it is quantized now."""
    from safetensors.torch import save

    return len(save(stored_tensors(model, codes=False)[0], metadata=_METADATA))


def save_quantized(model: torch.nn.Module, tokenizer: Any, folder: str | os.PathLike, spec: QuantSpec) -> dict[str, Any]:
    """Write the quantized model; returns the storage summary (tensors, bytes by kind)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, shapes = stored_tensors(model)
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata=_METADATA)
    recomputed = recomputed_tables(model)
    config = model.config
    config.quantization_config = {
        "quant_method": QUANT_METHOD, "bits": spec.label, "weight_bits": spec.weight_bits,
        "embedding_bits": spec.embedding_bits, "activation_bits": spec.activation_bits,
        "activation_clip": spec.activation_clip, "granularity": spec.granularity, "embedding_granularity": "row", "lm_head": "embedding bits, per row",
        "packing": {str(k): f"{v} bits per value" for k, v in BITS_PER_VALUE.items()},
        "activations": "symmetric per tensor, dynamic max-abs scale" + (
            f" of the activation clamped to +-{spec.activation_clip}" if spec.activation_clip else "")
        + ": linear inputs, q/k/v outputs, attention probabilities", "tensors": shapes}
    if spec.mixed:  # format 2 or 3: each tensor's bits are already in `tensors`; the rules and groups say why
        config.quantization_config.update(format_version=format_of(spec), rules=[list(r) for r in spec.rules],
                                          groups={g.name: b for g, b in bits_by_group(model, spec).items()})
    if recomputed:
        config.quantization_config["recomputed"] = recomputed
    try:
        config.save_pretrained(folder)
    finally:
        del config.quantization_config
    if getattr(model, "generation_config", None) is not None and config.is_encoder_decoder:
        model.generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return {"quantized_tensors": len(shapes)}


def computed_tables(model: torch.nn.Module):
    """(module name, module) of each table the architecture computes from its shape alone (a module's
    `create_weight`: Marian's and Pegasus' sinusoidal positions)."""
    for prefix, module in model.named_modules():
        if callable(getattr(module, "create_weight", None)):
            yield prefix, module


def recomputed_tables(model: torch.nn.Module) -> list[str]:
    """State-dict names of the computed tables (`computed_tables`) that still hold exactly the values computed."""
    names = []
    for prefix, module in computed_tables(model):
        weight = getattr(module, "weight", None)  # only a table's: reading a quantized module's weight quantizes it
        if isinstance(weight, torch.Tensor):
            with torch.no_grad():
                fresh = module.create_weight()
            if fresh.shape == weight.shape and torch.equal(fresh.to(weight.device, weight.dtype), weight.detach()):
                names.append(f"{prefix}.weight")
    return names


def _model_class(config: Any):
    from transformers import AutoModelForSeq2SeqLM, AutoModelForSequenceClassification, EncoderDecoderModel

    if config.model_type == ENCODER_DECODER_TYPE:
        return EncoderDecoderModel
    if getattr(config, "is_encoder_decoder", False):
        return AutoModelForSeq2SeqLM
    return AutoModelForSequenceClassification


def load_quantized(folder: str | os.PathLike) -> torch.nn.Module:
    """Rebuild a quantized artifact as a model that computes what the quantized model computed."""
    from transformers import AutoConfig

    from safetensors import SafetensorError

    folder = Path(folder)
    for name in ("config.json", WEIGHTS_NAME):
        if not (folder / name).is_file():
            raise UserError(f"cannot load the quantized model from {folder}: {name} is missing")
    try:
        raw = json.loads((folder / "config.json").read_bytes())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"cannot load the quantized model from {folder}: config.json is damaged or incomplete "
                        f"({str(e).splitlines()[0]})") from None
    if not is_quantized(raw):
        raise UserError(f"{folder} is not a modelshrink-quantized model")
    qc = raw["quantization_config"]
    version = qc.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(f"{folder} is a quantized model of format {version}, written by a newer modelshrink; this one "
                        f"reads formats up to {FORMAT_VERSION}: upgrade modelshrink to load it")
    config = AutoConfig.from_pretrained(folder)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    check_quantizable(config)
    cls = _model_class(config)
    model = cls(config=config) if cls.__name__ == "EncoderDecoderModel" else cls.from_config(config)
    try:
        stored = load_file(str(folder / WEIGHTS_NAME))
    except SafetensorError as e:
        raise UserError(f"cannot load the quantized model from {folder}: {WEIGHTS_NAME} is damaged or incomplete "
                        f"({str(e).splitlines()[0]})") from None
    absent = [k for name in qc["tensors"] for k in (f"{name}.qweight", f"{name}.scale") if k not in stored]
    if absent:
        raise UserError(f"cannot load the quantized model from {folder}: {WEIGHTS_NAME} lacks {absent[0]}, which "
                        "config.json's quantization_config lists (the two files are from different runs?)")
    state = {}
    for name, info in qc["tensors"].items():
        shape = info["shape"]
        numel = 1
        for d in shape:
            numel *= d
        b = unpack(stored[f"{name}.qweight"], info["bits"], numel).reshape(shape)
        alpha = stored[f"{name}.scale"]
        alpha = alpha.reshape(-1, 1) if info["per_row"] else alpha.reshape(())
        state[name] = dequantize(b, alpha)
    state.update({k: v for k, v in stored.items() if not k.endswith((".qweight", ".scale"))})
    for name in qc.get("recomputed", []):  # left out of the file: the module makes them from their shape
        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else None
        if module is None or not callable(getattr(module, "create_weight", None)):
            raise UserError(f"cannot load the quantized model from {folder}: config.json says {name} is computed "
                            f"from its shape, but this transformers' {type(model).__name__} has no such table")
        with torch.no_grad():
            state[name] = module.create_weight()
    missing, unexpected = model.load_state_dict(state, strict=False)
    model.tie_weights()
    tied = {k for k, v in model.state_dict().items() if k in missing and any(
        v.data_ptr() == model.state_dict()[s].data_ptr() for s in state if s in model.state_dict())}
    really_missing = sorted(set(missing) - tied)
    if really_missing or unexpected:
        raise UserError(f"{folder}: the quantized checkpoint does not match its config "
                        f"(missing {really_missing[:3]}, unexpected {list(unexpected)[:3]})")
    spec = QuantSpec(qc["weight_bits"], qc["embedding_bits"], qc["activation_bits"], qc["granularity"],
                     qc.get("activation_clip"), tuple((str(s), int(b)) for s, b in qc.get("rules", [])))
    quantize_model(model, spec, weights=False)  # weights already hold quantized values
    if getattr(config, "is_encoder_decoder", False) and (folder / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(folder)
    model.modelshrink_quant_spec = spec
    return model.eval()
