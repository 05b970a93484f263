"""The decoder's self-attention cache in buffers that onnxruntime writes in place.

An export whose decoder with past holds `GroupQueryAttention` (modelshrink.onnx.self_attention) takes the
cache as buffers [rows, heads, capacity, head size] and the number of positions filled
(`past_sequence_length`); bound as both past input and present output, each step writes its one new key and
value into them where the traced graph copied the whole past into a new tensor. The buffers are this
module's numpy arrays, so beam search moves a beam's cache with a copy of the filled positions of the rows
that changed beam (modelshrink.runtime.search), in place as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PAST_LENGTH = "past_sequence_length"  # the graph input that says how much of each buffer is filled
# the model metadata that says how many rows a document the decoder's fused cross-attention reads its keys and
# values in place for (modelshrink.onnx.cross_attention): their presents are then bound to the cached arrays
CROSS_BEAMS = "modelshrink.cross_attention_beams"


def _run_bound(session: Any, names: list[str], feed: dict[str, np.ndarray],
               into: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """session.run with the outputs in `into` written into those arrays (onnxruntime's I/O binding)."""
    import onnxruntime as ort

    binding = session.io_binding()
    for name, value in feed.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value)))
    for name in names:
        if name in into:
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(into[name]))
        else:
            binding.bind_output(name, "cpu")
    session.run_with_iobinding(binding)
    return {name: into[name] if name in into else value.numpy()
            for name, value in zip(names, binding.get_outputs())}


class InPlaceCache:
    """The first and next steps of one search over one batch (the callables of runtime.search) with the
    self-attention cache in buffers of `capacity` positions (grown by doubling should a search need more)."""

    def __init__(self, model: Any, capacity: int):
        self.model, self.capacity, self.length = model, max(int(capacity), 2), 0
        self.logits: np.ndarray | None = None  # the decoder's output [rows, 1, vocab], reused from step to step
        self.vocab = 0

    def first_step(self, tokens: np.ndarray, hidden: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, dict]:
        logits, past = self.model._first_step(tokens, hidden, mask)
        self.vocab = logits.shape[-1]
        self.length = next(v.shape[2] for n, v in past.items() if ".decoder." in n)
        self.capacity = max(self.capacity, self.length + 1)
        # the filled positions only: beam search repeats the first step's outputs for its beams, and the
        # buffers are made at the next step, for the rows the search runs on (4x fewer bytes to repeat)
        return logits, past

    def _buffer(self, filled: np.ndarray) -> np.ndarray:
        rows, heads, length, size = filled.shape
        buffer = np.empty((rows, heads, self.capacity, size), dtype=filled.dtype)
        buffer[:, :, :length] = filled
        return buffer

    def next_step(self, tokens: np.ndarray, mask: np.ndarray, past: dict) -> tuple[np.ndarray, dict]:
        model = self.model
        decoder = [n for n in model.past_names if ".decoder." in n]
        if self.length >= self.capacity:  # a search longer than announced: twice the room
            self.capacity *= 2
        # into buffers of `capacity` positions: the first step's outputs and, after a doubling, the old buffers;
        # a buffer whose rows the search took (a beam's rows) is contiguous again
        past = dict(past, **{n: np.ascontiguousarray(past[n]) if past[n].shape[2] == self.capacity
                             else self._buffer(past[n][:, :, :self.length]) for n in decoder})
        rows = tokens.shape[0]
        if self.logits is None or self.logits.shape[0] != rows:
            self.logits = np.empty((rows, 1, self.vocab), dtype=np.float32)
        into = {"logits": self.logits, **{n.replace("past_key_values", "present"): past[n] for n in decoder}}
        encoder = [n for n in model.past_names if ".encoder." in n]
        if model.cross_beams and encoder and rows == past[encoder[0]].shape[0] * model.cross_beams:
            # the fused cross-attention writes the last source position of each document again, in place
            past.update({n: np.ascontiguousarray(past[n], dtype=np.float32) for n in encoder})
            into.update({n.replace("past_key_values", "present"): past[n] for n in encoder})
        feed = {"input_ids": tokens, "encoder_attention_mask": mask, PAST_LENGTH: np.array([self.length], np.int64),
                **{n: past[n] for n in model.past_names}}
        model.run_decoder(feed, with_past=True, into=into)
        self.length += 1
        return self.logits[:, -1, :], past
