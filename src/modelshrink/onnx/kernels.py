"""Which kernel multiplies each low-bit weight of an export, chosen by measuring them on this machine.

A weight stored in low bits (`modelshrink.onnx.lowbit`) can compute four ways: MatMulNBits on its codes with
int8 activations (`nbits`), onnxruntime's integer kernel on its codes unpacked at load as int8 (`s8`, uint8
activations times int8 weights: offered only where the processor adds those products exactly, x86 with VNNI
or ARM, `modelshrink.runtime.cpu`) or as uint8 (`int8`; both only for codes with one scale per column; on the
model's own activation codes where the model rounds the input) or a float MatMul on the weight unpacked at
load (`float`). For an input the model
rounds, `auto` weighs only `int8` and `float`, which compute with that rounding, unless the export leaves the
rounding to the kernels (`export --activation-rounding kernel`, the default). Which is fastest depends on the
weight's shape, its bits, the processor and how many rows the graph multiplies at once: an encoder multiplies
every source token of every document (hundreds of rows), a decoder step one row per beam. So each candidate runs as a one-node graph at the rows its graph sees when serving at
batch 1 and at batch 16 (`ROWS`), and the one with the smallest geometric mean of its median times wins, except
that candidates within `MARGIN` of it count as tied (run-to-run noise on a busy machine moves near-equal kernels
past each other: BART-base's 768x768 weights measured nbits 0.32 / float 0.35 ms, then 0.28 / 0.28) and the tie
goes to the one reading the fewest weight bytes a call (among equals, MatMulNBits, then s8, then the uint8
kernel, then float), so that exporting twice gives the same graph unless the times straddle the margin; the
export report keeps every time. The measurement is of the machine that exports: export on the kind of machine
that serves, or name the kernel (`--kernel`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

import numpy as np

from modelshrink.onnx.lowbit import FLOAT, INT8, KERNELS, NBITS, S8, Blocks, kernel_block
from modelshrink.onnx.lowbit_graph import LowBitGraph
from modelshrink.runtime.files import CLASSIFIER, DECODER, DECODER_WITH_PAST, ENCODER

AUTO = "auto"
CHOICES = (AUTO, *KERNELS)
# rows a graph's matmuls see, serving at batch 1 and batch 16 (beam 4): the encoder's documents of ~64 tokens
# (grouped by length, so little padding), a decoder step one row per beam; the first decoder step shares the
# decoder's weights (merged into one graph), so it computes as the steps do
ROWS = {ENCODER: (64, 1024), CLASSIFIER: (64, 1024), DECODER: (4, 64), DECODER_WITH_PAST: (4, 64)}
REPEATS = 5
MARGIN = 1.10  # scores within 10% of the fastest are a tie, broken by the weight bytes a call reads
BYTES_READ = {NBITS: None, S8: 1.0, INT8: 1.0, FLOAT: 4.0}  # per weight; nbits reads its codes: bits / 8
# A wider weight (a vocabulary projection) is measured on this many of its columns: past a few thousand a kernel's
# time grows with the columns alone, and every candidate's session holds its own unpacked copy of the weight (a
# 1024 x 50264 projection's measurement took 1.9 GB, the peak of distilbart-cnn's --int8 export: issue 78)
MEASURED_COLUMNS = 8192


def rows_for(graph: str) -> tuple[int, ...]:
    return ROWS.get(graph, ROWS[ENCODER])


def _synthetic(k: int, n: int, bits: int, block_size: int, zero_points: bool) -> Blocks:
    """Blocks of the right shape with made-up codes: a kernel's speed does not depend on the values."""
    rng = np.random.default_rng(0)
    groups = -(-k // block_size)
    codes = rng.integers(0, 2 ** bits, size=(n, groups, block_size), dtype=np.uint8)
    # one zero point a column (the uint8 kernel holds no more), repeated over its blocks
    zero = np.repeat(rng.integers(0, 2 ** bits, size=(n, 1), dtype=np.uint8), groups, axis=1) if zero_points else None
    return Blocks(codes, np.full((n, groups), 0.01, dtype=np.float32), zero, bits, k)


def _session(k: int, n: int, blocks: Blocks, kernel: str, threads: int) -> Any:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.zeros((1, 1), dtype=np.float32), "weight")
    weight.dims[:] = [k, n]  # never read: the rewrite replaces it; its shape is what the rewrite checks
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "weight"], ["y"], name="matmul")], "kernel",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["rows", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewrite = LowBitGraph(model)
    rewrite.as_matmul(weight, blocks, kernel=kernel)
    rewrite.finish()
    # the lowest IR version its opsets need, not the installed onnx's newest: an older onnxruntime reads it
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the runtime runs
    return ort.InferenceSession(onnx.ModelProto.SerializeToString(model), options,
                                providers=["CPUExecutionProvider"])


def measure(k: int, n: int, candidates: list[tuple[str, int]], rows: tuple[int, ...], block_size: int,
            zero_points: bool = False, threads: int | None = None, repeats: int = REPEATS) -> dict[str, dict[int, float]]:
    """Median seconds of one [rows, k] x [k, n] product for each (kernel, bits) candidate at each row count, the
    candidates taking turns so that a change of load hits them alike: {"kernel/bits": {rows: seconds}}."""
    threads = threads or len(os.sched_getaffinity(0))
    sessions = {f"{kernel}/{bits}": _session(k, n, _synthetic(k, n, bits, kernel_block(kernel, bits, block_size),
                                                             zero_points and kernel != S8), kernel, threads)
                for kernel, bits in candidates}
    found: dict[str, dict[int, float]] = {name: {} for name in sessions}
    rng = np.random.default_rng(1)
    for count in rows:
        a = {"a": rng.standard_normal((count, k)).astype(np.float32)}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for session in sessions.values():
            session.run(None, a)  # warm-up: first-call allocations and prepacking
        for _ in range(repeats):
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(None, a)
                times[name].append(time.perf_counter() - start)
        for name, values in times.items():
            found[name][count] = statistics.median(values)
    return found


class KernelChoice:
    """How the low-bit weights of one graph compute: `choose` measures each weight shape once (or takes the kernel
    the user named) and remembers; `report` is what the export report keeps."""

    def __init__(self, graph: str, kernel: str = AUTO, threads: int | None = None,
                 available: tuple[str, ...] = KERNELS, measured: dict[tuple, dict[str, Any]] | None = None):
        if kernel not in CHOICES:
            raise ValueError(f"kernel must be one of {CHOICES}, got {kernel!r}")
        self.graph, self.kernel, self.threads, self.available = graph, kernel, threads, available
        self.rows = rows_for(graph)
        self.decisions: dict[str, dict[str, Any]] = {}
        # measurements shared by the graphs of one export that run at the same rows (the two decoder graphs)
        self.measured = measured if measured is not None else {}

    def choose(self, k: int, n: int, candidates: list[tuple[str, int]], block_size: int,
               zero_points: bool = False) -> tuple[str, int]:
        """(kernel, storage bits) for a [k, n] weight among `candidates` (the fewest bits first among equals)."""
        if self.kernel != AUTO:
            named = [c for c in candidates if c[0] == self.kernel]
            if not named:
                raise ValueError(f"kernel {self.kernel} cannot compute this weight; candidates: {candidates}")
            return min(named, key=lambda c: c[1])
        candidates = [c for c in candidates if c[0] in self.available] or [c for c in candidates if c[0] == FLOAT]
        if len(candidates) == 1:
            return candidates[0]
        key = f"{k}x{n} " + ", ".join(f"{kernel}/{bits}" for kernel, bits in candidates)
        shared = (key, self.rows, block_size, zero_points)
        if shared not in self.measured:
            times = measure(k, min(n, MEASURED_COLUMNS), candidates, self.rows, block_size, zero_points, self.threads)
            score = {name: math.exp(statistics.fmean(math.log(t) for t in by_rows.values()))
                     for name, by_rows in times.items()}
            fastest = min(score.values())
            best = min((name for name in score if score[name] <= fastest * MARGIN),
                       key=lambda name: (_bytes_read(name), KERNELS.index(name.split("/")[0]), score[name]))
            self.measured[shared] = {"chosen": best, "ms": {name: {str(r): round(t * 1e3, 4) for r, t in by_rows.items()}
                                                            for name, by_rows in times.items()}}
            if n > MEASURED_COLUMNS:
                self.measured[shared]["measured_columns"] = MEASURED_COLUMNS
        self.decisions[key] = self.measured[shared]
        kernel, bits = self.decisions[key]["chosen"].split("/")
        return kernel, int(bits)

    def report(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "rows": list(self.rows), "measured": self.decisions}


def _bytes_read(name: str) -> float:
    """Weight bytes a call of candidate "kernel/bits" reads: the codes themselves for nbits, the unpacked int8,
    uint8 or float32 weight for s8, int8 and float."""
    kernel, bits = name.split("/")
    return int(bits) / 8 if kernel == NBITS else BYTES_READ[kernel]


def candidates_for(threshold: int | None) -> list[tuple[str, int]]:
    """(kernel, storage bits) that hold a weight exactly: a `quantize` artifact's integer weight |b| <= threshold
    (ternary 1, 3-4 bits <= 7, 5-8 bits <= 127; symmetric, one scale per column), or None for --int4's blocks with
    zero points (4 bits; the integer kernels need one scale per column)."""
    if threshold is None:
        return [(NBITS, 4), (FLOAT, 4)]
    widths = [2, 4] if threshold == 1 else [4] if threshold <= 7 else [8]
    return [(NBITS, bits) for bits in widths] + [(S8, widths[0]), (INT8, widths[0]), (FLOAT, widths[0])]


def stored_bits(threshold: int | None, bits: int) -> int:
    """How wide the codes of a weight computing at `bits` are stored: a ternary weight (threshold 1) in 2 bits
    whatever its kernel reads (4-bit MatMulNBits, measured faster than the 2-bit one at every shape, widens them
    when the graph loads; the file holds them five a byte in base 3, `modelshrink.onnx.lowbit`), any other at
    the kernel's width."""
    return 2 if threshold == 1 else bits


# --int8's codes, one scale a column: the kernels that hold a quantize artifact's 8-bit weights (s8 on symmetric
# codes, the others on uint8 codes with a zero point a column)
INT8_CANDIDATES = candidates_for(127)
