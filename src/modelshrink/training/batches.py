"""The batches of a training epoch: a seeded shuffle of the examples, then batches of a fixed size or packed under a
token budget (`--max-tokens`), and each process's share of them under a launcher."""

from __future__ import annotations

from typing import Any

import torch

from modelshrink.options.train import TrainOptions


def make_batches(lengths: list[int], options: TrainOptions, epoch: int) -> list[list[int]]:
    """This epoch's batches of example indices: a seeded shuffle, then fixed-size batches, or with
    `max_tokens` batches packed by length (within windows of 100 batches) so that the padded size
    (longest × count) stays under the budget, then shuffled again."""
    g = torch.Generator().manual_seed(options.seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    if options.max_tokens is None:
        return [order[i:i + options.batch_size] for i in range(0, len(order), options.batch_size)]
    batches: list[list[int]] = []
    window = options.batch_size * 100
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        current: list[int] = []
        for i in chunk:
            longest = max([lengths[j] for j in current] + [lengths[i]])
            if current and longest * (len(current) + 1) > options.max_tokens:
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
    shuffle = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in shuffle]


def process_batches(lengths: list[int], options: TrainOptions, epoch: int, accelerator: Any) -> list[list[int]]:
    """This process's batches of the epoch: every world_size-th, equal counts on every process (for DDP)."""
    world = accelerator.num_processes
    batches = make_batches(lengths, options, epoch)
    usable = len(batches) // (world * options.grad_accum) * world * options.grad_accum
    return batches[accelerator.process_index:usable:world]
