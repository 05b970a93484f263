"""Footprint and speed: parameters, bytes on disk, latency percentiles, peak memory."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

# Files that hold weights. A quantized artifact is measured by what it stores, not by a float32 count.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".onnx_data", ".pt", ".pth", ".gguf")


def weight_bytes(folder: str | os.PathLike) -> int:
    folder = Path(folder)
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def parameter_count(model: Any) -> int:
    # Tied weights (BART's embeddings and LM head) are one tensor and are counted once.
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def reset_peak_memory(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return
    try:  # Linux: writing 5 to clear_refs resets the process's peak resident set (VmHWM)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory(device: str) -> dict[str, Any]:
    """Peak memory since the last reset: CUDA allocator peak on a GPU, else the process's peak
    resident set size (VmHWM), which includes the Python process itself."""
    import torch

    if device.startswith("cuda"):
        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated()), "peak_memory_kind": "cuda allocated"}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"peak_memory_bytes": int(line.split()[1]) * 1024, "peak_memory_kind": "process peak RSS"}
    except OSError:
        pass
    import resource

    return {"peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_memory_kind": "process peak RSS (since start)"}


def latency(run_one: Callable[[Any], None], items: Iterable[Any], warmup: int = 2) -> dict[str, float]:
    """Per-item wall time of `run_one` at batch 1, after `warmup` untimed items: p50, p90, mean in ms."""
    items = list(items)
    for item in items[:warmup]:
        run_one(item)
    times = []
    for item in items:
        start = time.perf_counter()
        run_one(item)
        times.append((time.perf_counter() - start) * 1000)
    if not times:
        return {}
    arr = np.asarray(times)
    return {"latency_ms_p50": float(np.percentile(arr, 50)), "latency_ms_p90": float(np.percentile(arr, 90)),
            "latency_ms_mean": float(arr.mean()), "latency_items": len(times), "latency_batch_size": 1,
            "latency_warmup_items": min(warmup, len(items))}
