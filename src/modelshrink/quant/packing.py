"""Dense storage of quantized integers b (int8, values in [-th, th], th = 2^(bits-1) - 1).

`pack` flattens b in row-major order into a 1-D uint8 tensor; `unpack` gives back the 1-D int8
values (reshape them yourself). Layouts, by bit width:

    bits 8       one byte per value: the int8 two's-complement byte itself.
    bits 5..7    one byte per value, same as 8 bits: dense 5-7 bit packing crosses byte
                 boundaries and would save at most 3/8 of the space, so these widths are stored
                 at 8 bits/value, no better than 8-bit on disk.
    bits 3..4    two values per byte as 4-bit two's-complement nibbles; value 2i in the low
                 nibble, value 2i+1 in the high nibble; an odd tail is padded with 0.
                 (3-bit values use 4 bits on disk.)
    bits 2       ternary {-1, 0, 1} in base 3, five trits per byte (3^5 = 243 <= 256):
                 byte = sum_j (v_{5i+j} + 1) · 3^j for j = 0..4, so 1.6 bits/value; the tail is
                 padded with the value 0.

`unpack` checks the byte count and that every decoded value is a valid code for the bit width,
so a file read back with the wrong width or length fails loudly instead of giving wrong weights.
"""

from __future__ import annotations

import torch

from modelshrink.quant.spec import code_threshold

BITS_PER_VALUE: dict[int, float] = {2: 1.6, 3: 4.0, 4: 4.0, 5: 8.0, 6: 8.0, 7: 8.0, 8: 8.0}

_TRITS_PER_BYTE = 5


def _check_bits(bits: int) -> int:
    if bits not in range(2, 9):
        raise ValueError(f"packing takes 2 to 8 bits, got {bits!r}")
    return code_threshold(int(bits))


def _check_range(values: torch.Tensor, th: int, bits: int, what: str) -> None:
    # No abs(): abs(int8 -128) is -128.
    if values.numel() and bool(((values < -th) | (values > th)).any()):
        raise ValueError(f"{what} values outside [-{th}, {th}], which {bits}-bit codes must lie in")


def packed_bytes(numel: int, bits: int) -> int:
    """The exact number of bytes `pack` produces for numel values at this bit width."""
    _check_bits(bits)
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if bits == 2:
        return -(-numel // _TRITS_PER_BYTE)
    if bits <= 4:
        return -(-numel // 2)
    return numel


def _powers_of_three(device: torch.device) -> torch.Tensor:
    return torch.tensor([1, 3, 9, 27, 81], dtype=torch.int16, device=device)


def pack(b: torch.Tensor, bits: int) -> torch.Tensor:
    """b (int8, any shape, values in [-th, th]) as a new 1-D uint8 tensor of packed_bytes(b.numel(), bits)."""
    th = _check_bits(bits)
    if b.dtype != torch.int8:
        raise ValueError(f"pack takes int8 values, got {b.dtype}")
    flat = b.detach().reshape(-1)
    _check_range(flat, th, bits, "pack got")
    if bits >= 5:
        return flat.view(torch.uint8).clone()
    if bits >= 3:
        nibbles = flat.to(torch.int16) & 0x0F
        if nibbles.numel() % 2:
            nibbles = torch.cat([nibbles, nibbles.new_zeros(1)])
        pairs = nibbles.view(-1, 2)
        return (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8)
    trits = flat.to(torch.int16) + 1
    pad = (-trits.numel()) % _TRITS_PER_BYTE
    if pad:
        trits = torch.cat([trits, trits.new_ones(pad)])  # trit 1 is the value 0
    groups = trits.view(-1, _TRITS_PER_BYTE)
    return (groups * _powers_of_three(flat.device)).sum(dim=1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """The first numel int8 values stored in packed (1-D uint8 from `pack` at the same bit width)."""
    th = _check_bits(bits)
    expected = packed_bytes(numel, bits)
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != expected:
        raise ValueError(f"expected a 1-D uint8 tensor of {expected} bytes for {numel} {bits}-bit values, "
                         f"got {packed.dtype} of shape {tuple(packed.shape)}")
    packed = packed.detach()
    if bits >= 5:
        values = packed.view(torch.int8).clone()
    elif bits >= 3:
        wide = packed.to(torch.int16)
        nibbles = torch.stack([wide & 0x0F, wide >> 4], dim=1).reshape(-1)[:numel]
        values = (nibbles - ((nibbles & 0x08) << 1)).to(torch.int8)  # sign-extend 4-bit two's complement
    else:
        wide = packed.to(torch.int16)
        if wide.numel() and bool((wide >= 3 ** _TRITS_PER_BYTE).any()):
            raise ValueError("ternary bytes must be below 243; this is not base-3 packed data")
        digits = (wide.unsqueeze(1) // _powers_of_three(packed.device)) % 3
        values = (digits.reshape(-1)[:numel] - 1).to(torch.int8)
    _check_range(values, th, bits, "unpacked")
    return values
