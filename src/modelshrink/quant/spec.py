"""What `quantize --bits` asks for, parsed without torch (the options import it).

`W-E-A` is DQ-BART's notation: bits of linear weights, word embeddings (and the LM head), activations. Rules after
it give parts of the model other bits (issue 55's mixed precision), later rules over earlier ones:

    2-2-8,cross_attention=8,decoder.ffn=4,decoder.0=8,lm_head=4,embeddings=4

A rule is `SELECTOR=BITS`, the selector one or more of, in this order, joined by dots: a stack (`encoder`,
`decoder`), a layer number (after a stack), a kind (`attention` = self-attention, `cross_attention`, `ffn`) — or
one of the parts outside the layers: `embeddings` (the word embeddings; `encoder.embeddings` and
`decoder.embeddings` in a model whose encoder and decoder have a table each, as bert2bert), `positions` (learned
position tables, `encoder.positions` and `decoder.positions` where each stack has one: float unless a rule sets
them), `lm_head` (the output embedding; in a model that ties it to the word embeddings it is the same tensor, so it
takes their bits), `head` (a classifier's pooler and classifier). A stack or layer alone selects layers, never a
part outside them. Bits 2 (ternary) to 8; activations keep A.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from modelshrink.errors import UserError

SUPPORTED_BITS = (2, 3, 4, 5, 6, 7, 8)
STACKS = ("encoder", "decoder")
LAYER_KINDS = ("attention", "cross_attention", "ffn")
OUTSIDE_KINDS = ("embeddings", "positions", "lm_head", "head")
TABLE_KINDS = ("embeddings", "positions")  # a stack can have one of its own: `decoder.embeddings`


def code_threshold(bits: int) -> int:
    """The largest |b| a `bits`-bit weight code holds: 1 for ternary (2 bits), 2^(bits-1) - 1 for 3 to 8 bits."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"weights take 2 (ternary) to 8 bits, got {bits!r}")
    return 1 if bits == 2 else 2 ** (bits - 1) - 1


@dataclass(frozen=True, order=True)
class Group:
    """A set of weights that share one bit width: the linear layers of one kind in one layer of one stack
    (`decoder.2.cross_attention`), or a part outside the layers (`embeddings`, `positions`, or a stack's own table
    such as `decoder.embeddings`; `lm_head`, `head`); linears of a stack that fit none of the kinds are
    `encoder.other` / `decoder.other`."""

    stack: str = ""  # "" outside the stacks
    layer: int = -1  # -1 outside the layers
    kind: str = ""

    @property
    def name(self) -> str:
        return ".".join(p for p in (self.stack, "" if self.layer < 0 else str(self.layer), self.kind) if p)

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Encoder, decoder, then the parts outside; by layer; by kind in the order a layer runs them."""
        kinds = LAYER_KINDS + ("other",) + OUTSIDE_KINDS
        return ((STACKS + ("",)).index(self.stack), self.layer, kinds.index(self.kind))

    @classmethod
    def parse(cls, text: str) -> "Group":
        """The inverse of `name` (a plan file's keys)."""
        selector = Selector.parse(text)
        return cls(selector.stack or "", -1 if selector.layer is None else selector.layer, selector.kind or "")


@dataclass(frozen=True)
class Selector:
    """The left side of a rule: which groups it sets."""

    stack: str | None = None
    layer: int | None = None
    kind: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Selector":
        parts = text.strip().split(".")
        stack = parts.pop(0) if parts and parts[0] in STACKS else None
        layer = None
        if parts and parts[0].isdecimal():
            if stack is None:
                raise UserError(f"--bits rule '{text}': a layer number follows a stack, as in decoder.{parts[0]}")
            layer = int(parts.pop(0))
        kind = parts.pop(0) if parts and parts[0] in LAYER_KINDS + OUTSIDE_KINDS + ("other",) else None
        if parts or (stack is None and kind is None):
            raise UserError(f"--bits rule '{text}': a selector is [encoder|decoder][.LAYER][.KIND] with KIND one of "
                            f"{', '.join(LAYER_KINDS)}, or one of {', '.join(OUTSIDE_KINDS)}")
        if kind in OUTSIDE_KINDS and stack is not None and (kind not in TABLE_KINDS or layer is not None):
            hint = f"{kind}=BITS" + (f", or {stack}.{kind}=BITS for the {stack}'s own table"
                                     if kind in TABLE_KINDS else "")
            raise UserError(f"--bits rule '{text}': {kind} is outside the layers; write it alone ({hint})")
        return cls(stack, layer, kind)

    def matches(self, group: Group) -> bool:
        """Whether the rule sets `group`; a part outside the layers only by its kind (`encoder=8` sets the
        encoder's layers, not its word embeddings: `encoder.embeddings=8` does)."""
        if self.kind is None and group.kind in OUTSIDE_KINDS:
            return False
        return ((self.stack is None or self.stack == group.stack) and (self.layer is None or self.layer == group.layer)
                and (self.kind is None or self.kind == group.kind))

    @property
    def text(self) -> str:
        return Group(self.stack or "", -1 if self.layer is None else self.layer, self.kind or "").name


@dataclass(frozen=True)
class QuantSpec:
    weight_bits: int
    embedding_bits: int
    activation_bits: int
    granularity: str = "tensor"  # of linear weights; embeddings are always per row
    activation_clip: float | None = None  # activations clamped to ±this before their max-abs scale
    rules: tuple[tuple[str, int], ...] = ()  # (selector text, bits), later over earlier

    @property
    def label(self) -> str:
        return ",".join([self.base_label] + [f"{s}={b}" for s, b in self.rules])

    @property
    def base_label(self) -> str:
        return f"{self.weight_bits}-{self.embedding_bits}-{self.activation_bits}"

    @property
    def mixed(self) -> bool:
        return bool(self.rules)

    def default_bits(self, group: Group) -> int | None:
        if group.kind == "positions":
            return None  # DQ-BART keeps them float; a rule quantizes them
        return self.embedding_bits if group.kind in ("embeddings", "lm_head") else self.weight_bits

    def bits_of(self, group: Group) -> int | None:
        """The bits `group` gets: the last rule that selects it, else W (linears) or E (embeddings, LM head); None
        for position tables no rule selects (left in float)."""
        bits = self.default_bits(group)
        for selector, value in self.rules:
            if Selector.parse(selector).matches(group):
                bits = value
        return bits

    def with_rules(self, rules: tuple[tuple[str, int], ...]) -> "QuantSpec":
        return replace(self, rules=tuple(rules))


def _parse_rule(text: str, whole: str) -> tuple[str, int]:
    selector, sep, value = text.partition("=")
    if not sep or not value.strip().isdecimal():
        raise UserError(f"--bits {whole}: '{text}' is not a rule; rules are SELECTOR=BITS, such as "
                        "cross_attention=8 or decoder.1.ffn=4")
    bits = int(value)
    if bits not in SUPPORTED_BITS:
        raise UserError(f"--bits {whole}: '{text}' asks for {bits} bits; weights take 2 (ternary) to 8")
    return Selector.parse(selector).text, bits


def parse_bits(text: str, allow_low_activation_bits: bool = False, granularity: str = "tensor",
               activation_clip: float | None = None) -> QuantSpec:
    """'W-E-A' such as 8-8-8, 4-4-8, 2-2-8, optionally followed by rules (',decoder.ffn=4') → QuantSpec; a
    UserError for anything else."""
    head, *rule_texts = [p.strip() for p in str(text).split(",")]
    parts = head.split("-")
    if len(parts) != 3 or not all(p.strip().isdecimal() for p in parts):
        raise UserError(f"--bits takes W-E-A, three whole numbers such as 8-8-8 or 2-2-8 (then rules such as "
                        f",cross_attention=8 if you like); got '{text}'")
    w, e, a = (int(p) for p in parts)
    for value, what in ((w, "weight"), (e, "embedding"), (a, "activation")):
        if value not in SUPPORTED_BITS:
            raise UserError(f"--bits {text}: {what} bits must be 2 (ternary) to 8, got {value}")
    if a < 8 and not allow_low_activation_bits:
        raise UserError(f"--bits {text}: activations below 8 bits lose much more quality than weights (DQ-BART keeps "
                        "them at 8); pass --allow-low-activation-bits to try anyway")
    if granularity not in ("tensor", "row"):
        raise UserError(f"--granularity must be tensor or row, got {granularity}")
    if activation_clip is not None and not 0 < activation_clip < float("inf"):
        raise UserError(f"--activation-clip takes a positive number (the DQ-BART authors use 2.5), got {activation_clip}")
    rules = tuple(_parse_rule(r, text) for r in rule_texts)
    return QuantSpec(w, e, a, granularity, None if activation_clip is None else float(activation_clip), rules)


def parse_candidates(text: str) -> tuple[int, ...]:
    """'2,4,8' → (2, 4, 8): the widths a budget chooses from, at least two."""
    try:
        values = sorted({int(p) for p in str(text).split(",") if p.strip()})
    except ValueError:
        values = []
    if len(values) < 2 or any(v not in SUPPORTED_BITS for v in values):
        raise UserError(f"--candidate-bits takes two or more widths from 2 to 8, such as 2,4,8; got '{text}'")
    return tuple(values)


def check_budget_spec(spec: QuantSpec) -> None:
    """With a budget, --bits gives the activation bits and pins; W and E must not claim every weight."""
    if (spec.weight_bits, spec.embedding_bits) != (8, 8):
        raise UserError(f"--bits {spec.label} sets every weight's bits, and --budget-mb chooses them: give the budget "
                        f"with --bits 8-8-{spec.activation_bits} (and rules to pin layers, such as "
                        f"8-8-{spec.activation_bits},lm_head=8), or drop --budget-mb")
