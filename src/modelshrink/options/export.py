"""Options of `modelshrink export`."""

from __future__ import annotations

from typing import ClassVar

from modelshrink.errors import UserError
from modelshrink.options import REQUIRED, Options, opt, options_class

LAYOUTS = ("optimum", "transformers.js")  # the folder layouts `export` writes (modelshrink.onnx.layout)

CHECK = "Validation against PyTorch"
MIN_OPSET, MAX_OPSET = 14, 20
ROUNDING_CHOICES = ("auto", "model", "none", "kernel")  # "auto", then modelshrink.onnx.compress.ROUNDINGS
KERNEL_CHOICES = ("auto", "nbits", "s8", "int8", "float")  # modelshrink.onnx.kernels.CHOICES  # 14: the attention ops of these models; 20: the newest the torch exporter writes


@options_class
class ExportOptions(Options):
    """Every option of `modelshrink export`."""

    STEP: ClassVar[str] = "export"
    GOES_WITH: ClassVar[dict[str, str]] = {"per_channel": "int8", "int4_block_size": "int4", "int4_embeddings": "int4"}

    model: str = opt(REQUIRED, "A model artifact: seq2seq (also from quantize) or a sequence classifier.",
                     argument=True)
    opset: int = opt(17, "ONNX opset, 14-20.", min=MIN_OPSET, max=MAX_OPSET)
    int8: bool = opt(False, "8-bit matmul weights (one scale per output column: uint8 with a zero point, or int8 "
                            "symmetric for the s8 kernel) multiplied with 8-bit activations rounded per call, on the "
                            "integer kernel measured fastest here (see --kernel); embedding tables in int8 with one "
                            "scale per row.", flags=("--int8",))
    int4: bool = opt(False, "4-bit matmul weights and embedding tables, one scale and zero point per block "
                            "(onnxruntime's MatMulNBits and GatherBlockQuantized, round to nearest), multiplied "
                            "with int8 activations where that measures faster (see --kernel).", flags=("--int4",))
    int4_block_size: int | None = opt(None, "With --int4: weights per scale along the input dimension, 16-128 "
                                            "(onnxruntime's kernel). [default: 32]", choices=(16, 32, 64, 128))
    int4_embeddings: bool | None = opt(None, "With --int4: embedding tables (and an output projection tied to one) "
                                             "in 4 bits too; --no-int4-embeddings keeps them float32 (on BART-base's "
                                             "shape 0.57x of float32 instead of 0.16x). [default: on]")
    kernel: str = opt("auto", "How low-bit matmul weights (a quantize artifact's, --int4's, --int8's) compute: auto "
                              "(the fastest here, measured per graph and weight shape; see the export report), s8 "
                              "(onnxruntime's integer kernel on int8 weights, uint8 activations rounded per tensor: "
                              "VNNI's instruction, 2-2.4x the others from 64 rows on; exact only on x86 with VNNI "
                              "or on ARM, so auto weighs it only there and the folder then runs only there), int8 "
                              "(onnxruntime's uint8 kernel, activations rounded per tensor; quantize artifacts and "
                              "--int8: what onnxruntime's dynamic quantization writes; runs on every CPU), nbits "
                              "(MatMulNBits on the "
                              "codes, activations rounded to int8 per block), float (float matmuls on the weights "
                              "unpacked at load: no integer kernel, for a runtime without one).",
                      choices=KERNEL_CHOICES)
    activation_rounding: str = opt("auto", "Whose rounding of a quantize artifact's activations the graphs compute. "
                                           "model: every rounding the quantized model does (8 bits per tensor), "
                                           "matmul inputs multiplied as the model's own codes; none: the same codes "
                                           "for the matmuls, attention's queries, keys, values and probabilities left "
                                           "float, so the attention can be fused (5-9% faster at batch 1 and 5-12% "
                                           "at batch 16 on BART-base's shape, ROUGE unchanged on a trained 2-2-8 "
                                           "model); kernel: as none, but each integer kernel rounds its input its "
                                           "own way (the uint8 kernel per tensor, as --int8's; MatMulNBits per block "
                                           "of K), which lets --kernel auto weigh MatMulNBits. auto: kernel (the "
                                           "fastest at every width measured, 0.43-0.49x float32's batch-1 time on "
                                           "BART-base's shape; BENCHMARKS.md, lowbit).",
                                   choices=ROUNDING_CHOICES)
    per_channel: bool | None = opt(None, "With --int8: one weight scale per output channel (--no-per-channel: one per "
                                         "tensor). [default: per channel]")
    merge: bool = opt(True, "Seq2seq: one decoder_model_merged.onnx (an If between first step and steps with past, "
                            "weights stored once) instead of decoder_model.onnx + decoder_with_past_model.onnx.")
    self_attention: str = opt("fused", "Seq2seq: the decoder's self-attention with past as fused (onnxruntime's "
                                       "GroupQueryAttention, the cache written in place in buffers the runtime "
                                       "holds; with the merged decoder, the cross-attention too, over each source's "
                                       "own length at the generation config's num_beams; where the traced attention "
                                       "is the plain pattern: not T5, not a quantize artifact's "
                                       "--activation-rounding model) or traced (the exporter's ops, a new cache "
                                       "tensor at every step; for a runtime without the op).",
                              choices=("fused", "traced"))
    layout: str = opt("optimum", "The folder as a client loads it: optimum (graphs beside config.json, Optimum's "
                                 "ORTModelForSeq2SeqLM; every family) or transformers.js (graphs in onnx/ named by "
                                 "weight type, for @huggingface/transformers; bart, t5 and classifiers, not "
                                 "bert2bert). Both run with modelshrink.runtime.", choices=LAYOUTS)
    validate: bool = opt(True, "Check outputs and generated tokens against PyTorch.", panel=CHECK)
    atol: float | None = opt(None, "Largest allowed absolute difference of any output (padded source positions are not "
                                   "compared). [default: 1e-4, times the output's largest magnitude where it exceeds "
                                   "1; with --int8, an RMS difference of a quarter of each output's RMS; with --int4, "
                                   "0.6 of it; for a quantize artifact, 0.1, or twice the most that PyTorch in float64 "
                                   "moves an output, if more]", panel=CHECK, above=0)
    data: str | None = opt(None, "Documents to validate on. [default: made from the tokenizer's vocabulary]",
                           panel=CHECK)
    text_column: str | None = opt(None, "Document column of --data. [default: auto]", panel=CHECK)
    samples: int = opt(4, "Documents whose outputs are compared.", panel=CHECK, min=1)
    generation_docs: int = opt(4, "Documents summarized (greedy and beam) or classified by both; 0 skips.", panel=CHECK, min=0)
    max_source_length: int | None = opt(None, "Truncate validation documents. [default: the smaller of the "
                                              "tokenizer's limit and the model's positions]", panel=CHECK, min=1)
    trust_remote_code: bool = opt(False, "Allow the model's own code from the hub.")
    allow_pickle: bool = opt(False, "Load pickle weights (pytorch_model.bin) with torch.load(weights_only=True); "
                                    "refused by default, since pickles can run code.")

    def check(self) -> None:
        if self.int4 and self.int8:
            raise UserError("--int4 and --int8 exclude each other: pick one weight format")
        if self.activation_rounding != "auto" and (self.int8 or self.int4):
            raise UserError("--activation-rounding applies to a quantize artifact exported in its own bits, not with "
                            "--int8 or --int4")
        if self.kernel in ("int8", "s8") and self.int4:
            raise UserError(f"--kernel {self.kernel} needs one scale per output column (a quantize artifact's or "
                            "--int8's weights); --int4's blocks each have their own: use --kernel nbits or float")
        if self.int4 and self.int4_block_size is None:
            self.int4_block_size = 32
        if self.int4 and self.int4_embeddings is None:
            self.int4_embeddings = True
        if self.int8 and self.per_channel is None:
            self.per_channel = True
