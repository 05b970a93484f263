"""A student from the teacher's own layers ("shrink", Shleifer & Rush 2020; DQ-BART section 2.2).

The student is a copy of the teacher that keeps a subset of its encoder and decoder layers; every
other weight (embeddings, positions, final norms, LM head) is the teacher's. Layers are chosen
maximally spaced, first and last kept (12→6 = 0 2 4 7 9 11), except that a one-layer stack keeps
the teacher's LAST layer, which DQ-BART found works better than the first.
"""

from __future__ import annotations

import copy

from torch import nn

from modelshrink.errors import UserError
from modelshrink.families import Family, encoder_layer_count, encoder_layer_list, family_of


def _check_count(n_teacher: int, n_student: int, side: str, option: str | None = None) -> None:
    option = option or f"--{side}-layers"
    if n_student < 1:
        raise UserError(f"{option} must be >= 1, got {n_student}")
    if n_student > n_teacher:
        raise UserError(f"{option} {n_student} is above the teacher's {n_teacher} {side} layers")


def spaced_layer_ids(n_teacher: int, n_student: int, side: str = "encoder", option: str | None = None) -> list[int]:
    """Maximally spaced teacher layers, first and last kept; one layer keeps the last."""
    _check_count(n_teacher, n_student, side, option)
    if n_student == 1:
        return [n_teacher - 1]
    # floor(i * (n - 1) / (k - 1) + 0.5) in integers, so that halves round up exactly (12→3 gives 6).
    k1 = n_student - 1
    return [(2 * i * (n_teacher - 1) + k1) // (2 * k1) for i in range(n_student)]


def first_layer_ids(n_teacher: int, n_student: int, side: str = "encoder", option: str | None = None) -> list[int]:
    """The teacher's first `n_student` layers."""
    _check_count(n_teacher, n_student, side, option)
    return list(range(n_student))


def check_layer_ids(ids: list[int], n_teacher: int, side: str, option: str | None = None) -> list[int]:
    """Explicit layer ids, validated against the teacher; their order is kept as given."""
    option = option or f"--{side}-layer-ids"
    ids = [int(i) for i in ids]
    if not ids:
        raise UserError(f"{option} is empty; give at least one {side} layer id")
    for i in ids:
        if not 0 <= i < n_teacher:
            raise UserError(f"{option}: layer {i} is out of range; the teacher's {side} layers are 0..{n_teacher - 1}")
    seen = set()
    for i in ids:
        if i in seen:
            raise UserError(f"{option}: layer {i} repeats; each teacher layer can be kept once")
        seen.add(i)
    return ids


def layer_counts(model: nn.Module) -> tuple[int, int]:
    """(encoder layers, decoder layers) of a supported model."""
    family = family_of(model.config)
    return len(family.encoder_layers_of(model)), len(family.decoder_layers_of(model))


def _set_dotted(config, dotted: str, value) -> None:
    *parents, name = dotted.split(".")
    for parent in parents:
        config = getattr(config, parent)
    setattr(config, name, value)


def _set_layer_counts(student: nn.Module, family: Family, n_enc: int, n_dec: int) -> None:
    config = student.config
    _set_dotted(config, family.encoder_layers_config, n_enc)
    _set_dotted(config, family.decoder_layers_config, n_dec)
    # Some submodules hold their own config object: T5's stacks each get a deep copy of the model
    # config (the decoder's with num_layers = num_decoder_layers), and an EncoderDecoderModel built
    # from separately made halves may keep the halves' original configs. Caches are sized from these
    # (DynamicCache(config=...)), so each must give its own stack's count.
    for half, n in ((student.get_encoder(), n_enc), (student.get_decoder(), n_dec)):
        seen = {id(config), id(getattr(config, "encoder", None)), id(getattr(config, "decoder", None))}
        for module in half.modules():
            sub = getattr(module, "config", None)
            if sub is None or id(sub) in seen or not hasattr(sub, "num_hidden_layers"):
                continue
            seen.add(id(sub))
            if type(sub) is type(config):  # a copy of the model config (T5): mirror both counts first
                _set_dotted(sub, family.encoder_layers_config, n_enc)
                _set_dotted(sub, family.decoder_layers_config, n_dec)
            sub.num_hidden_layers = n


def _move_position_bias(teacher_layers: nn.ModuleList, layers: nn.ModuleList, attn_path: str, bias_name: str):
    """T5: the relative position bias lives in a stack's first block and is shared by the others.

    A fresh T5 has it in block 0 only; the saved student must look the same to load with no missing
    or unexpected keys, and its first block must carry the teacher's bias whichever layer it was.
    """
    teacher_first = teacher_layers[0].get_submodule(attn_path)
    for position, layer in enumerate(layers):
        attn = layer.get_submodule(attn_path)
        if position == 0:
            if not getattr(attn, "has_relative_attention_bias", False):
                setattr(attn, bias_name, copy.deepcopy(teacher_first.get_submodule(bias_name)))
                attn.has_relative_attention_bias = True
        elif getattr(attn, "has_relative_attention_bias", False):
            delattr(attn, bias_name)
            attn.has_relative_attention_bias = False


def _keep_layers(layers: nn.ModuleList, ids: list[int]) -> None:
    """Keep `layers[i]` for i in `ids`, in that order (ids do not repeat; the layers are already the
    student's own deep copies)."""
    kept = [layers[i] for i in ids]
    del layers[:]
    layers.extend(kept)
    for position, layer in enumerate(layers):
        # Attention modules index the KV cache by layer_idx (BART/T5/BERT attention keep it on the
        # attention module itself); a stale teacher index would read or grow the wrong slot.
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = position


def shrink(model: nn.Module, encoder_ids: list[int], decoder_ids: list[int]) -> nn.Module:
    """A new student keeping the teacher's encoder layers `encoder_ids` and decoder layers
    `decoder_ids`, in that order; the teacher is left unchanged."""
    family = family_of(model.config)
    n_enc, n_dec = layer_counts(model)
    encoder_ids = check_layer_ids(encoder_ids, n_enc, "encoder")
    decoder_ids = check_layer_ids(decoder_ids, n_dec, "decoder")

    # Deep-copying the whole model keeps the tied weights (embeddings, LM head) tied in the student.
    student = copy.deepcopy(model)
    sides = ((family.encoder_layers_of(model), family.encoder_layers_of(student), encoder_ids,
              [family.encoder_self]),
             (family.decoder_layers_of(model), family.decoder_layers_of(student), decoder_ids,
              [family.decoder_self, family.decoder_cross]))
    for teacher_layers, layers, ids, attn_paths in sides:
        _keep_layers(layers, ids)
        if family.position_bias:
            _move_position_bias(teacher_layers, layers, attn_paths[0], family.position_bias)

    _set_layer_counts(student, family, len(encoder_ids), len(decoder_ids))
    student.config.modelshrink_layer_map = {"encoder": list(encoder_ids), "decoder": list(decoder_ids)}
    return student


def shrink_encoder(model: nn.Module, layer_ids: list[int], option: str = "--layer-ids") -> nn.Module:
    """A new encoder-only student (e.g. a sequence classifier) keeping the teacher's layers
    `layer_ids`, in that order, and everything else (embeddings, pooler, head) as it is."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise UserError("shrink_encoder takes an encoder-only model; use shrink for encoder-decoders")
    n = encoder_layer_count(model.config)
    layer_ids = check_layer_ids(layer_ids, n, "encoder", option)
    student = copy.deepcopy(model)
    _keep_layers(encoder_layer_list(student), layer_ids)
    student.config.num_hidden_layers = len(layer_ids)
    student.config.modelshrink_layer_map = {"encoder": list(layer_ids)}
    return student
