"""Quantization (DQ-BART): quantizers, bit packing, model surgery, and quantized storage."""
