"""How a step batches when `--batch-size` is not given: a count of examples on a CPU, a padded-token budget on a
GPU (issue 54).

On a GPU a fixed count wastes the device twice: a batch of short documents leaves it idle, a batch of long ones
runs out of memory. Packing length-sorted examples up to a token budget keeps every batch about the same size in
memory and work, so the defaults there are budgets: `GPU_MAX_TOKENS` of the options class (16,384 source tokens a
generation batch, 4,096 a training micro-batch). `--batch-size N` (or `--max-tokens N`) given says what the user
wants and is kept, on any device; `contrastive` keeps a count everywhere, because ACKD's negatives are the other
sentences of the batch and the paper's batch sizes (8, 16, 32) are a hyperparameter.

The step resolves its options once, first, with the device it runs on; the manifest records the resolved values,
so that the artifact replays with the same batches on any machine.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T")


def resolve_batching(options: T, device: str) -> T:
    """`options` with `batch_size` (and, on a CUDA device, `max_tokens`) filled in where the user left them to the
    default; options whose batch size is given come back as they are."""
    if getattr(options, "batch_size", 0) is not None:
        return options
    budget = type(options).GPU_MAX_TOKENS
    on_gpu = str(device).startswith("cuda")
    changes = {"batch_size": type(options).BATCH_SIZE}
    if on_gpu and budget is not None and options.max_tokens is None:
        changes["max_tokens"] = budget
    return dataclasses.replace(options, **changes)
