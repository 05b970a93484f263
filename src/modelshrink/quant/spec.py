"""What `quantize --bits W-E-A` asks for (DQ-BART's notation), parsed without torch: the options import it."""

from __future__ import annotations

from dataclasses import dataclass

from modelshrink.errors import UserError

SUPPORTED_BITS = (2, 3, 4, 5, 6, 7, 8)


@dataclass(frozen=True)
class QuantSpec:
    weight_bits: int
    embedding_bits: int
    activation_bits: int
    granularity: str = "tensor"  # of linear weights; embeddings are always per row
    activation_clip: float | None = None  # activations clamped to ±this before their max-abs scale

    @property
    def label(self) -> str:
        return f"{self.weight_bits}-{self.embedding_bits}-{self.activation_bits}"


def parse_bits(text: str, allow_low_activation_bits: bool = False, granularity: str = "tensor",
               activation_clip: float | None = None) -> QuantSpec:
    """'W-E-A' such as 8-8-8, 4-4-8, 2-2-8 → QuantSpec; a UserError for anything else."""
    parts = text.split("-")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise UserError(f"--bits takes W-E-A, three whole numbers such as 8-8-8 or 2-2-8; got '{text}'")
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
    return QuantSpec(w, e, a, granularity, None if activation_clip is None else float(activation_clip))
