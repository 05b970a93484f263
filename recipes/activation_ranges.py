"""python recipes/activation_ranges.py MODEL DATA [--docs 64] [--clip 2.5]

How far a seq2seq model's linear-layer inputs reach, against the DQ-BART authors' activation clamp
(`quantize --activation-clip`): one teacher-forced forward pass over the first DOCS validation pairs of DATA
(document/summary or source/target rows), each nn.Linear's input recorded. Prints the median and largest
per-layer peak |x|, the share of layers whose input passes the clamp somewhere and the share of all entries
beyond it (REPRODUCTION.md, DQ-BART: why the clamp collapses one teacher's direct 8-8-8 and not another's).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("data", help="jsonl(.gz) rows: document/summary or source/target")
    parser.add_argument("--docs", type=int, default=64)
    parser.add_argument("--clip", type=float, default=2.5)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    with (gzip.open(args.data, "rt") if args.data.endswith(".gz") else open(args.data)) as f:
        rows = [json.loads(line) for _, line in zip(range(args.docs), f)]
    text, target = ("source", "target") if "source" in rows[0] else ("document", "summary")
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    batch = tokenizer([r[text] for r in rows], text_target=[r[target] for r in rows], padding=True,
                      truncation=True, max_length=args.max_length, return_tensors="pt")
    peaks: dict[str, float] = {}
    beyond: dict[str, tuple[int, int]] = {}

    def record(name: str):
        def hook(module, inputs, output):
            x = inputs[0].detach().abs()
            peaks[name] = max(peaks.get(name, 0.0), float(x.max()))
            n, total = beyond.get(name, (0, 0))
            beyond[name] = (n + int((x > args.clip).sum()), total + x.numel())
        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(record(name))
    with torch.no_grad():
        model(**batch)
    largest = max(peaks, key=peaks.get)
    print(f"{args.model}: {len(peaks)} linear layers over {len(rows)} pairs (padding included)")
    print(f"peak |input| per layer: median {statistics.median(peaks.values()):.2f}, largest {peaks[largest]:.2f} "
          f"({largest})")
    print(f"layers whose input passes ±{args.clip:g} somewhere: "
          f"{100 * sum(p > args.clip for p in peaks.values()) / len(peaks):.0f}%")
    n, total = map(sum, zip(*beyond.values()))
    print(f"entries beyond ±{args.clip:g}: {100 * n / total:.2f}%")


if __name__ == "__main__":
    main()
