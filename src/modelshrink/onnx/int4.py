"""`--int4`: matmul weights as block-wise 4-bit codes, run by onnxruntime's `com.microsoft::MatMulNBits`.

Round-to-nearest weights: a float MatMul whose B input is a 2-D initializer [K, N] becomes
MatMulNBits(A, codes, scales, zero_points), which multiplies A by (code - zero point) * scale; at accuracy level
4 it rounds A to int8 per block and multiplies in integers (on this project's 2-core machine 2.4x faster than
a float MatMul at 4 rows, 1.2x at 64: `modelshrink.onnx.lowbit`). Where a float MatMul on the weight unpacked at
load measures faster for a graph (`modelshrink.onnx.kernels`), that is used instead; the file is the same size.
Each column of B is cut along K into blocks of `block_size` values, each with one float scale. The layout
is the op's (onnxruntime's docs/ContribOperators.md): codes uint8 [N, ceil(K / block_size), block_size / 2],
two codes a byte, the code of the even k in the low nibble; scales float [N * n_blocks], block-major within
a column; zero points uint8 [N * ceil(n_blocks / 2)], packed the same way, each column starting on a
byte. K that is not a multiple of the block size is padded with zeros, as onnxruntime's own quantizer does.

With zero points (one 4-bit zero point a block, the op's optional input): a block spans its own
[min(0, lowest), max(0, highest)] in 15 steps. On trained weights (all-MiniLM-L6-v2's 37 matmuls; a
bert2bert teacher warm-started from it measured the same) that rounds with an RMS error of 8.3% of the
weights' RMS at block 32 (10.7% at 128), against 9.0% (11.2%) for symmetric codes without zero points
(the largest magnitude on code -8). It costs half a byte a block, 2.5% more bytes at block 32; onnxruntime's
own quantizer defaults to it too.

Embedding tables (read by Gather on axis 0) whose width is a multiple of the block size are rounded the same
way, row by row, and read by GatherBlockQuantized; a tied output projection (the table's transpose) shares the
table's codes (`modelshrink.onnx.lowbit`). On BART-base's shape the word table is a quarter of the float32
weights, so this is what brings the folder from ~0.28x to below 0.2x of float32. Positional tables read by
other ops, matmuls whose B is computed (attention's products) and Gemm nodes stay float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx import lowbit
from modelshrink.onnx.kernels import KernelChoice, candidates_for
from modelshrink.onnx.lowbit_graph import LowBitGraph, transposed_pairs
from modelshrink.onnx.saving import save_graph

CANDIDATES = candidates_for(None)  # blocks with their own scales and zero points: MatMulNBits, or float
BLOCK_SIZES = (16, 32, 64, 128)  # what onnxruntime's CPU kernel accepts at 4 bits (a power of 2, >= 16)


def quantize_blocks(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, scales, zero points) of a [K, N] weight, round to nearest: codes and zero points uint8 in 0..15,
    codes [N, n_blocks, block_size], scales float32 and zero points [N, n_blocks];
    weight ~ (code - zero point) * scale."""
    k, n = weight.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n), dtype=np.float32)
    padded[:k] = weight
    columns = padded.T.reshape(n, blocks, block_size)
    low, high = np.minimum(columns.min(axis=2), 0), np.maximum(columns.max(axis=2), 0)
    scales = ((high - low) / 15).astype(np.float32)
    safe = np.where(scales == 0, 1.0, scales).astype(np.float32)
    zero_points = np.clip(np.round(-low / safe), 0, 15)
    codes = np.clip(np.round(columns / safe[..., None] + zero_points[..., None]), 0, 15)
    return codes.astype(np.uint8), scales, zero_points.astype(np.uint8)


def pack(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes a byte along the last axis (padded to even with a zero), the first in the low nibble."""
    return lowbit.pack(codes, 4)


def unpack(packed: np.ndarray, count: int) -> np.ndarray:
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)[..., :count]


def dequantize(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, k: int) -> np.ndarray:
    """The [K, N] float weight that MatMulNBits multiplies by, from the op's inputs."""
    n, blocks, _ = packed.shape
    codes = unpack(packed, 2 * packed.shape[-1]).astype(np.float32)
    zero = unpack(zero_points.reshape(n, -1), blocks).astype(np.float32)
    values = (codes - zero[..., None]) * scales.reshape(n, blocks, 1)
    return values.reshape(n, -1)[:, :k].T


def rtn_blocks(weight: np.ndarray, block_size: int) -> lowbit.Blocks:
    codes, scales, zero_points = quantize_blocks(weight, block_size)
    return lowbit.Blocks(codes, scales, zero_points, 4, weight.shape[0])


def quantize_int4(path: Path, block_size: int, choice: KernelChoice, embeddings: bool = True) -> dict[str, Any]:
    """Rewrite the graph at `path`: embedding tables whose width is a multiple of the block size as
    GatherBlockQuantized (a tied output projection sharing the table's codes), then every other MatMul whose
    B is a 2-D float initializer as 4-bit blocks, each computing with the kernel `choice` measures fastest
    (MatMulNBits with int8 activations, or a float MatMul on the weight unpacked at load). An initializer is
    converted only when every node reading it is such a lookup or MatMul, so no float copy stays behind.
    Returns what was converted: matmul nodes, tables, weights, their bytes before and after, the kernels. `embeddings=False` leaves the tables float32 (their tied
    projections are then 4-bit matmul weights of their own)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = LowBitGraph(model)
    pairs = transposed_pairs(graph)
    inits = {i.name: i for i in model.graph.initializer}
    nodes = weights = tables = 0
    done: set[str] = set()
    tables_found = [i for i in model.graph.initializer if graph.gather_table(i) and i.dims[1] % block_size == 0]
    for init in tables_found if embeddings else []:
        tied = [inits[name] for name in pairs.get(init.name, [])]
        kernel = choice.choose(init.dims[1], init.dims[0], CANDIDATES, block_size, zero_points=True)[0]
        nodes += graph.as_tied(init, tied, rtn_blocks(numpy_helper.to_array(init).T, block_size), kernel)
        done.update(t.name for t in tied)
        tables += 1
        weights += 1 + len(tied)
    for init in [i for i in model.graph.initializer if i.name not in done and graph.matmul_weight(i)]:
        kernel = choice.choose(*init.dims, CANDIDATES, block_size, zero_points=True)[0]
        nodes += graph.as_matmul(init, rtn_blocks(numpy_helper.to_array(init), block_size), kernel=kernel)
        weights += 1
    graph.finish()
    save_graph(model, path)
    summary = graph.summary("int4")
    return {"int4_matmuls": nodes, "int4_tables": tables, "int4_weights": weights, "kernels": choice.report(),
            **summary}
