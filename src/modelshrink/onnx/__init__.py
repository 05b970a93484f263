"""ONNX export: graphs traced from PyTorch, rewrites of the written graphs, validation against PyTorch.

- `graphs`: the torch wrappers with flat tensors (encoder, decoder steps, classifier), the exporter call,
  search_ops.onnx;
- `merge`: weights stored once (the two decoders as one graph with an If; tied output projections);
- `compress`: weights in 8 bits (a `quantize` artifact's integer weights; `--int8`; embedding tables);
- `validate`: outputs and generated tokens against PyTorch.
`modelshrink.export` is the step that runs them. Inside this package `import onnx` is the onnx project's package.
"""
