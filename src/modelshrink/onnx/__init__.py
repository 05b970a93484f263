"""ONNX export: graphs traced from PyTorch, rewrites of the written graphs, validation against PyTorch.

- `graphs`: the torch wrappers with flat tensors (encoder, decoder steps, classifier), the exporter call,
  search_ops.onnx;
- `fuse`: the decoder with past for decoding speed (cross-attention once per document, no copies made only
  for a shape or by one-input Concat nodes);
- `self_attention`: the decoder's self-attention with past as GroupQueryAttention, its cache written in place;
- `cross_attention`: the decoder's cross-attention with past as GroupQueryAttention over each source's own
  length, a document's beams as its query heads (an If keeps the per-document attention for other callers);
- `merge`: weights stored once (the two decoders as one graph with an If; tied output projections);
- `compress`: weights in 8 bits (a `quantize` artifact's integer weights; `--int8`; embedding tables);
- `int4`: `--int4` (MatMulNBits and GatherBlockQuantized);
- `lowbit`: a `quantize` artifact's codes in their own bits and the matmuls on them; `kernels`: which kernel
  each weight gets, measured on this machine;
- `layout`: the folder as a client loads it (Optimum's names, transformers.js's onnx/ folder);
- `validate`: outputs and generated tokens against PyTorch.
`modelshrink.steps.export` is the step that runs them. Inside this package `import onnx` is the onnx project's package.
"""
