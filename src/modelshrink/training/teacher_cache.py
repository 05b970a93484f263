"""ACKD's frozen teacher run once: its logits and mapped-layer features for every training sentence
(`contrastive --teacher-cache`, the default), gathered across processes under a launcher, and a collate that
hands each example its rows."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from modelshrink.training.ackd import layer_features


def teacher_outputs(teacher: Any, examples: list[dict[str, Any]], collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
                    pairs: list[tuple[int, int]], pooling: str, device: Any, batch_size: int = 64,
                    progress: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen teacher's logits [N, C] and features [N, M, d] (float32, on the CPU) for every
    example, computed once. Under a launcher each process runs its share (every W-th sentence) and
    the shares are gathered, so every process ends with the whole table."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    mine = list(range(rank, len(examples), world))
    mine.sort(key=lambda i: examples[i]["length"])  # similar lengths together: little padding
    teacher_layers = [t for _, t in pairs]
    logits = [torch.zeros(0, teacher.config.num_labels)]
    features = [torch.zeros(0, len(pairs), teacher.config.hidden_size if pairs else 0)]
    with torch.no_grad():
        for start in range(0, len(mine), batch_size):
            chunk = mine[start:start + batch_size]
            batch = collate([examples[i] for i in chunk])
            inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
            out = teacher(**inputs, output_hidden_states=bool(pairs))
            z = (torch.stack(layer_features(out.hidden_states, teacher_layers, pooling, inputs["attention_mask"]), 1)
                 if pairs else out.logits.new_zeros(len(chunk), 0, 0))
            logits.append(out.logits.float().cpu())
            features.append(z.float().cpu())
            if progress is not None:
                progress(min(start + batch_size, len(mine)), len(mine))
    order = torch.tensor(mine, dtype=torch.long)
    local_logits, local_features = torch.cat(logits), torch.cat(features)
    if distributed:  # pad every share to the longest (one sentence at most), gather, drop the padding
        width = (len(examples) + world - 1) // world
        gathered = []
        for t in (order, local_logits, local_features):
            padded = t.new_zeros((width, *t.shape[1:]))
            padded[:t.shape[0]] = t
            on_device = padded.to(device)
            parts = [torch.zeros_like(on_device) for _ in range(world)]
            dist.all_gather(parts, on_device)
            gathered.append([p.cpu()[:len(range(r, len(examples), world))] for r, p in enumerate(parts)])
        order, local_logits, local_features = (torch.cat(g) for g in gathered)
    table_logits = torch.empty((len(examples), *local_logits.shape[1:]))
    table_features = torch.empty((len(examples), *local_features.shape[1:]))
    table_logits[order], table_features[order] = local_logits, local_features
    return table_logits, table_features


def with_cached_teacher(collate: Callable[[list[dict[str, Any]]], dict[str, Any]], logits: torch.Tensor,
                        features: torch.Tensor) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """A collate that adds each example's cached teacher rows (examples carry their `index`)."""
    def collate_cached(batch: list[dict[str, Any]]) -> dict[str, Any]:
        out = collate(batch)
        rows = torch.tensor([b["index"] for b in batch], dtype=torch.long)
        out["teacher_logits"], out["teacher_features"] = logits[rows], features[rows]
        return out

    return collate_cached


def cache_teacher(teacher: Any, examples: list[dict[str, Any]], collate: Callable, pairs: list[tuple[int, int]],
                   pooling: str, device: Any, log: Callable[[str], None],
                   resolved: dict[str, Any]) -> Callable:
    """The teacher's logits and features computed once; a collate that hands them out by example."""
    started = time.perf_counter()
    for i, example in enumerate(examples):
        example["index"] = i
    logits, features = teacher_outputs(teacher, examples, collate, pairs, pooling, device)
    size = (logits.numel() + features.numel()) * 4
    log(f"teacher outputs cached for {len(examples):,} sentences ({size / 2**20:.1f} MiB) in "
        f"{time.perf_counter() - started:.0f} s")
    resolved["teacher_cache_bytes"] = size
    return with_cached_teacher(collate, logits, features)
