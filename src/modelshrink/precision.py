"""Number formats: `--precision` of the training steps (accelerate's mixed precision) and `--dtype`
of the generating steps (the weights themselves in that format).

fp16 needs a GPU: CPU kernels for float16 are missing or slow, and accelerate's loss scaling is a
CUDA feature. bf16 on a CPU works (3x slower than fp32 without bf16 instructions, faster with AMX), which
is what lets the half-precision paths be tested on a machine without one.
"""

from __future__ import annotations

from typing import Any

from modelshrink.errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16")


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def check_precision(name: str, device: str, flag: str = "--precision") -> None:
    """Refuse what cannot run on `device` (a resolved device: cpu, cuda, cuda:N)."""
    if name not in PRECISIONS:
        raise UserError(f"{flag} {name} is not one of {', '.join(PRECISIONS)}")
    if name == "fp16" and not str(device).startswith("cuda"):
        raise UserError(f"{flag} fp16 needs a CUDA GPU (this run is on {device}); use bf16 on a CPU")
    if name == "bf16" and str(device).startswith("cuda"):
        import torch

        if not torch.cuda.is_bf16_supported():
            raise UserError(f"{flag} bf16 is not supported by this GPU ({torch.cuda.get_device_name()}); use fp16")
