"""How an export's graphs store their weights: modelshrink.json's resolved "weights", the one home of its kinds.

`modelshrink export` records it as data, `{"kind": ..., "widths": [...], "int8_initializers": ...,
"description": ...}`; the description is a sentence for people, and nothing reads it. The runtime and the
transformers.js layout (`modelshrink.onnx.layout`) read `WeightFormat.from_recorded`, which also reads what exports
before the structured form recorded: the sentence alone ("float32", "int8 (…)", "int4 (…)", "quantized: 2 and
4-bit codes (…)" with " + " and `INT8_SCALED` or `DEQUANTIZED`, or either of those alone). Torch-free, like the
rest of the runtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FLOAT32, INT8, INT4, QUANTIZED = "float32", "int8", "int4", "quantized"
KINDS = (FLOAT32, INT8, INT4, QUANTIZED)  # float32; --int8; --int4; a quantize artifact's own integer weights
# how a quantize artifact's weights that no low-bit op reads are stored: int8 initializers turned into floats by
# Cast and Mul by their scales, or (exports before Cast and Mul) by DequantizeLinear
CAST_MUL, DEQUANTIZE_LINEAR = "cast_mul", "dequantize_linear"
# the sentences those two were written as, which the description still uses
INT8_SCALED = "int8 initializers (Cast, Mul by their scales)"  # a quantize artifact's 5-8-bit weights
DEQUANTIZED = "int8 initializers + DequantizeLinear"  # exports before Cast/Mul: the runtime keeps reading them
_INITIALIZERS = {CAST_MUL: INT8_SCALED, DEQUANTIZE_LINEAR: DEQUANTIZED}
_DESCRIPTIONS = {FLOAT32: "float32", INT8: "int8 (8-bit weights per column: s8, uint8, MatMulNBits or float matmuls)",
                 INT4: "int4 (MatMulNBits, or float matmuls unpacked at load)"}
_CODES = "-bit codes (MatMulNBits, uint8 or float matmuls; GatherBlockQuantized)"


@dataclass(frozen=True)
class WeightFormat:
    """kind: one of KINDS; widths: the bits of the low-bit codes stored (8 for --int8, 4 for --int4, the quantize
    artifact's own, none for float32); int8_initializers: for QUANTIZED, how the weights no low-bit op reads are
    stored (CAST_MUL, DEQUANTIZE_LINEAR or None: as float32)."""

    kind: str
    widths: tuple[int, ...] = ()
    int8_initializers: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown weight format kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if self.int8_initializers not in (None, *_INITIALIZERS):
            raise ValueError(f"unknown int8_initializers {self.int8_initializers!r}; expected one of "
                             f"{', '.join(_INITIALIZERS)} or null")

    @property
    def description(self) -> str:
        """The format in a sentence, for people."""
        if self.kind != QUANTIZED:
            return _DESCRIPTIONS[self.kind]
        rest = _INITIALIZERS.get(self.int8_initializers or "")
        if not self.widths:
            return rest or "quantized (no weight in integers)"
        return f"quantized: {' and '.join(map(str, self.widths))}{_CODES}" + (f" + {rest}" if rest else "")

    def recorded(self) -> dict[str, Any]:
        """What modelshrink.json records."""
        return {"kind": self.kind, "widths": list(self.widths), "int8_initializers": self.int8_initializers,
                "description": self.description}

    @classmethod
    def from_recorded(cls, value: Any) -> WeightFormat | None:
        """The format modelshrink.json records (`recorded`'s dict, or an older export's sentence); None where it
        records none (Optimum's folders, exports before the field). ValueError for anything else."""
        if value is None:
            return None
        if isinstance(value, dict):
            widths = value.get("widths") or []
            if not isinstance(widths, list) or not all(isinstance(w, int) for w in widths):
                raise ValueError(f"weights' widths must be a list of integers, got {widths!r}")
            return cls(value.get("kind"), tuple(widths), value.get("int8_initializers"))
        if isinstance(value, str):
            return _from_sentence(value)
        raise ValueError(f"weights must be an object or a sentence, got {type(value).__name__}")


def _from_sentence(text: str) -> WeightFormat:
    """The format an export before the structured form described (every sentence it ever wrote)."""
    for stored, sentence in _INITIALIZERS.items():
        if text == sentence:
            return WeightFormat(QUANTIZED, (), stored)
    if text == "float32":
        return WeightFormat(FLOAT32)
    if text.startswith("int8 ("):
        return WeightFormat(INT8, (8,))
    if text.startswith("int4 ("):
        return WeightFormat(INT4, (4,))
    found = re.fullmatch(r"quantized: (\d+(?: and \d+)*)-bit codes \([^)]*\)(?: \+ (.+))?", text)
    if found is not None:
        rest = {sentence: kind for kind, sentence in _INITIALIZERS.items()}.get(found[2] or "")
        if found[2] is None or rest is not None:
            return WeightFormat(QUANTIZED, tuple(int(w) for w in found[1].split(" and ")), rest)
    raise ValueError(f"unknown weight format {text!r}")
