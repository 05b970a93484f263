"""The decoder's self-attention cache in buffers that onnxruntime writes in place.

An export whose decoder with past holds `GroupQueryAttention` (modelshrink.onnx.self_attention) takes the
cache as buffers [rows, heads, capacity, head size] and the number of positions filled
(`past_sequence_length`); bound as both past input and present output, each step writes its one new key and
value into them where the traced graph copied the whole past into a new tensor. The buffers are this
module's numpy arrays, so beam search moves a beam's cache with a copy of the filled positions of the rows
that changed beam (modelshrink.runtime.search), in place as before.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

PAST_LENGTH = "past_sequence_length"  # the graph input that says how much of each buffer is filled
# the model metadata that says how many rows a document the decoder's fused cross-attention reads its keys and
# values in place for (modelshrink.onnx.cross_attention): their presents are then bound to the cached arrays
CROSS_BEAMS = "modelshrink.cross_attention_beams"


def _run_bound(session: Any, names: list[str], feed: dict[str, np.ndarray],
               into: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """session.run with the outputs in `into` written into those arrays (onnxruntime's I/O binding)."""
    return Binding(session, names).run(feed, into)


class Binding:
    """One session's I/O binding, kept from run to run: an input or output is bound again only when it is another
    array than the one bound before, so the cache buffers, written in place, stay bound for a whole search.
    Binding 30 arrays anew took about 0.2 ms a decoder step on 2 cores, a tenth of a 3-layer MiniLM step at
    batch 1 x beam 4. The arrays bound are held here, so that none is freed while onnxruntime reads or writes it."""

    def __init__(self, session: Any, names: list[str]):
        self.session, self.names = session, names
        self.binding = session.io_binding()
        self.held: dict[str, Any] = {}  # name -> the array bound (an output onnxruntime allocates: "cpu")
        self.values: dict[str, Any] = {}  # name -> its OrtValue

    def _bind(self, name: str, value: Any, output: bool) -> None:
        import onnxruntime as ort

        if self.held.get(name) is value:
            return
        if isinstance(value, str):
            self.binding.bind_output(name, value)
        else:
            ortvalue = ort.OrtValue.ortvalue_from_numpy(value)
            (self.binding.bind_ortvalue_output if output else self.binding.bind_ortvalue_input)(name, ortvalue)
            self.values[name] = ortvalue
        self.held[name] = value

    def run(self, feed: dict[str, np.ndarray], into: dict[str, np.ndarray],
            wanted: Callable[[str], bool] = lambda name: True) -> dict[str, np.ndarray]:
        """Every output by name (those in `into` written into those arrays); an output not in `into` for which
        `wanted` is false is left out, and not copied out of onnxruntime."""
        for name, value in feed.items():
            self._bind(name, value if value.flags.c_contiguous else np.ascontiguousarray(value), output=False)
        for name in self.names:
            self._bind(name, into.get(name, "cpu"), output=True)
        self.session.run_with_iobinding(self.binding)
        out = {name: into[name] for name in self.names if name in into}
        if any(name not in into and wanted(name) for name in self.names):
            for name, value in zip(self.names, self.binding.get_outputs()):
                if name not in into and wanted(name):
                    out[name] = value.numpy()
        return out


class InPlaceCache:
    """The first and next steps of one search over one batch (the callables of runtime.search) with the
    self-attention cache in buffers of `capacity` positions (grown by doubling should a search need more)."""

    def __init__(self, model: Any, capacity: int):
        self.model, self.capacity, self.length = model, max(int(capacity), 2), 0
        self.logits: np.ndarray | None = None  # the decoder's output [rows, 1, vocab], reused from step to step
        self.vocab = 0
        # the step's small inputs, written in place, and the decoder's I/O binding, kept from step to step
        self.past_length = np.zeros(1, dtype=np.int64)
        self.tokens: np.ndarray | None = None
        self.binding: Binding | None = None

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
        if self.tokens is None or self.tokens.shape != tokens.shape:
            self.tokens = np.empty(tokens.shape, dtype=np.int64)
        self.tokens[...] = tokens
        self.past_length[0] = self.length
        feed = {"input_ids": self.tokens, "encoder_attention_mask": mask, PAST_LENGTH: self.past_length,
                **{n: past[n] for n in model.past_names}}
        if self.binding is None:
            self.binding = model.decoder_binding()
        model.run_decoder(feed, with_past=True, into=into, binding=self.binding)
        self.length += 1
        return self.logits[:, -1, :], past
