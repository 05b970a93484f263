"""Which quantized weights share a bit width (a `Group`), and the bits each weight gets from a `QuantSpec`.

A group is the linear layers of one kind in one layer (`decoder.2.cross_attention`: the query, key, value and
output projections of that layer's cross-attention), or a part outside the layers (`embeddings`, `lm_head`,
`head`). The names come from the modules' own names (families.py lists the words each family uses), so every
family's layers group alike. The word embeddings and a tied LM head are one tensor, hence one group. A model whose
encoder and decoder each have a table of their own (bert2bert, a Marian without shared embeddings) has two,
`encoder.embeddings` and `decoder.embeddings` (the decoder's holds a tied LM head): they carry different things (a
bert2bert student's encoder table stays close to the pretrained one, its decoder's moves far), so a budget gives
each its own bits; the rule `embeddings=BITS` still sets both. Learned position tables are `positions` (per stack
alike), quantized only where a rule names them.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.utils import parametrize

from modelshrink.errors import UserError
from modelshrink.families import (CLASSIFIER_HEAD_NAMES, CROSS_ATTENTION_NAMES, FEED_FORWARD_NAMES,
                                  SELF_ATTENTION_NAMES)
from modelshrink.quant.spec import STACKS, Group, QuantSpec, Selector

# DistilBERT's stack is `transformer`: an encoder.
_STACK_ALIASES = {"encoder": "encoder", "decoder": "decoder", "transformer": "encoder"}


def weight_of(module: nn.Module) -> Any:
    """The module's weight tensor: the latent one under a parametrization (tied modules share it)."""
    if parametrize.is_parametrized(module, "weight"):
        return module.parametrizations.weight.original
    return module.weight


def word_embeddings(model: nn.Module) -> list[nn.Embedding]:
    """Every embedding module that holds word (token) embeddings, tied copies included."""
    weights = {id(weight_of(model.get_input_embeddings()))}
    # the decoder's own table where it has one: bert2bert's `model.decoder`, a Marian without shared embeddings'
    # `model.model.decoder` (get_decoder finds both; for BART or T5 it is the shared table again)
    decoder = model.get_decoder() if getattr(model.config, "is_encoder_decoder", False) else None
    table = decoder.get_input_embeddings() if hasattr(decoder, "get_input_embeddings") else None
    if table is not None:
        weights.add(id(weight_of(table)))
    return [m for m in model.modules() if isinstance(m, nn.Embedding) and id(weight_of(m)) in weights]


def _stack(parts: list[str]) -> str:
    """The stack a module's qualified name (split at the dots) is in, or "" outside both."""
    return next((_STACK_ALIASES[p] for p in parts if p in _STACK_ALIASES), "")


def position_tables(model: nn.Module) -> list[nn.Embedding]:
    """Every learned position table (BERT's `position_embeddings`, BART's `embed_positions`); not the tables an
    architecture computes from their shape (Marian's sinusoids: never stored, so nothing to quantize)."""
    return [m for name, m in model.named_modules() if isinstance(m, nn.Embedding) and "position" in
            name.rsplit(".", 1)[-1] and not callable(getattr(m, "create_weight", None))]


def table_groups(model: nn.Module, tables: list[nn.Embedding], kind: str = "embeddings") -> dict[int, Group]:
    """The group of each table tensor (by id): `encoder.KIND` and `decoder.KIND` where the two stacks each use one
    of their own and nothing else uses either, else `KIND` for every table."""
    users: dict[int, set[str]] = {}
    ids = {id(m) for m in tables}
    for name, module in model.named_modules(remove_duplicate=False):
        if id(module) in ids:
            users.setdefault(id(weight_of(module)), set()).add(_stack(name.split(".")))
    stacks = {tensor: next(iter(used)) if len(used) == 1 else "" for tensor, used in users.items()}
    if sorted(stacks.values()) != sorted(STACKS):
        return {tensor: Group(kind=kind) for tensor in stacks}
    return {tensor: Group(stack, -1, kind) for tensor, stack in stacks.items()}


def linear_group(name: str) -> Group:
    """The group of a linear layer (not the LM head) from its qualified name."""
    parts = name.split(".")
    stack = _stack(parts)
    layer = next((int(p) for p in parts if p.isdigit()), -1)
    if layer < 0:
        if stack and not any(p in CLASSIFIER_HEAD_NAMES for p in parts):
            return Group(stack, -1, "other")
        return Group("", -1, "head" if any(p in CLASSIFIER_HEAD_NAMES for p in parts) else "other")
    names = set(parts)
    kind = ("cross_attention" if names & CROSS_ATTENTION_NAMES else "attention" if names & SELF_ATTENTION_NAMES
            else "ffn" if names & FEED_FORWARD_NAMES else "other")
    return Group(stack or "encoder", layer, kind)


def weight_groups(model: nn.Module) -> dict[Group, list[tuple[str, nn.Module]]]:
    """Every weight that quantization can store as integers, by group: (module name, module) pairs, tied copies
    included (they take their tensor's bits); sorted by group. Position tables are among them, though a spec
    quantizes them only where a rule says (`QuantSpec.bits_of` is None otherwise)."""
    head = model.get_output_embeddings()
    embeddings = word_embeddings(model)
    positions = position_tables(model)
    tables = {**table_groups(model, embeddings), **table_groups(model, positions, "positions")}
    found: dict[Group, list[tuple[str, nn.Module]]] = {}
    table_ids = {id(m) for m in embeddings + positions}
    for name, module in model.named_modules():
        if id(module) in table_ids:
            group = tables[id(weight_of(module))]
        elif module is head and isinstance(module, nn.Linear):
            group = tables.get(id(weight_of(head)), Group(kind="lm_head"))  # tied: its table's group
        elif isinstance(module, nn.Linear):
            group = linear_group(name)
        else:
            continue
        found.setdefault(group, []).append((name, module))
    return dict(sorted(found.items(), key=lambda item: item[0].sort_key))


def _missing(selector: str, groups: list[Group], model: nn.Module) -> str:
    """Why a rule selects nothing, in a phrase."""
    parsed = Selector.parse(selector)
    head = model.get_output_embeddings()
    if parsed.kind == "lm_head" and head is not None:
        tied = [g for g, modules in weight_groups(model).items()
                if g.kind == "embeddings" and any(m is head for _, m in modules)]
        if tied:
            return f"this model ties its LM head to the word embeddings (one tensor): set {tied[0].name}=BITS for both"
    if parsed.kind in ("embeddings", "positions") and parsed.stack and Group(kind=parsed.kind) in groups:
        what = {"embeddings": "word-embedding", "positions": "position"}[parsed.kind]
        return f"this model's encoder and decoder share one {what} table: set {parsed.kind}=BITS"
    if parsed.kind == "positions" and not any(g.kind == "positions" for g in groups):
        if any(callable(getattr(m, "create_weight", None)) for m in model.modules()):
            return "this model computes its positions from their shape (sinusoids), which are not stored at all"
        return "this model has no learned position table"
    layers = {s: sorted({g.layer for g in groups if g.stack == s and g.layer >= 0}) for s in STACKS}
    have = "; ".join(f"{s} layers {v[0]}-{v[-1]}" for s, v in layers.items() if v) or "no layers"
    kinds = sorted({g.kind for g in groups})
    return f"this model has {have}, and parts {', '.join(kinds)}"


def check_rules(model: nn.Module, spec: QuantSpec) -> None:
    """A UserError for a rule that selects no weight of this model."""
    groups = list(weight_groups(model))
    for selector, bits in spec.rules:
        if not any(Selector.parse(selector).matches(g) for g in groups):
            raise UserError(f"--bits rule {selector}={bits} selects nothing: {_missing(selector, groups, model)}")


def quantized_groups(model: nn.Module, spec: QuantSpec) -> dict[Group, list[tuple[str, nn.Module]]]:
    """`weight_groups` less those `spec` leaves in float (position tables no rule selects)."""
    return {g: m for g, m in weight_groups(model).items() if spec.bits_of(g) is not None}


def bits_by_group(model: nn.Module, spec: QuantSpec) -> dict[Group, int]:
    """The bits of every group `spec` quantizes (rules checked against the model first)."""
    check_rules(model, spec)
    return {group: spec.bits_of(group) for group in quantized_groups(model, spec)}
