"""The end-to-end chain on the bundled sample, offline: what README's first command runs.

Today the chain is: warm-start a bert2bert teacher from the packaged MiniLM, pseudo-label the
bundled Debian sample at λ = 1 and λ = 2, and score both sets of pseudo labels against the gold
summaries with `eval` (λ = 2 tested against λ = 1). The teacher is not fine-tuned yet (that needs
`distill`), so its summaries are not meaningful; the run shows the artifacts, the manifests and
the speed.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from modelshrink.artifacts import ArtifactWriter, check_output, parent_ref
from modelshrink.evaluate import EvalOptions, evaluate
from modelshrink.models import save_model
from modelshrink.pseudolabel import ProgressFn, PseudolabelOptions, pseudolabel
from modelshrink.warmstart import WARMSTART_GENERATION, init_encoder_decoder, packaged_minilm


def sample_path(split: str = "train") -> Path:
    """A bundled sample of Debian package descriptions (document -> one-line summary)."""
    return Path(str(resources.files("modelshrink") / "samples" / "debian" / f"{split}.jsonl"))


def warmstart_artifact(encoder: str, output: Path, overwrite: bool = False, seed: int = 0) -> Path:
    model, tokenizer = init_encoder_decoder(encoder, seed=seed)
    with ArtifactWriter(output, overwrite=overwrite) as writer:
        save_model(model, tokenizer, writer.staging)
        options = {"init_encoder_decoder": encoder, "seed": seed, "generation": WARMSTART_GENERATION}
        metrics = {"parameters": sum(p.numel() for p in model.parameters())}
        return writer.commit(step="warmstart", kind="model", options=options,
                             parents=[parent_ref("encoder", encoder)], metrics=metrics)


def run_quickstart(output: str | Path, *, limit: int = 64, lambdas: tuple[float, ...] = (1.0, 2.0),
                   max_length: int = 24, overwrite: bool = False,
                   progress: Callable[[str], ProgressFn] | None = None,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the chain into `output` (a folder of artifacts); returns a summary of each λ run."""
    log = log or (lambda message: None)
    output = check_output(output, overwrite)
    if output.exists():
        shutil.rmtree(output)
    output.mkdir()
    log("warm-starting a bert2bert teacher from the packaged MiniLM-L6 (not fine-tuned yet)")
    teacher = warmstart_artifact(packaged_minilm(), output / "teacher")
    data = sample_path("train")
    runs = {}
    first_eval = None
    for lam in lambdas:
        name = f"pseudolabel-lambda{lam:g}"
        options = PseudolabelOptions(teacher=str(teacher), data=str(data), limit=limit, lam=lam,
                                     max_length=max_length, batch_size=16, max_source_length=256)
        path = pseudolabel(options, output / name, progress=progress(f"λ={lam:g}") if progress else None, log=log)
        manifest = json.loads((path / "modelshrink.json").read_text())
        first = json.loads((path / "data.jsonl").open().readline())
        # The pseudo labels scored against the gold summaries, the later λ tested against the first.
        eval_path, metrics = evaluate(EvalOptions(data=str(path), against=first_eval), output / f"eval-{name}")
        first_eval = first_eval or str(eval_path)
        runs[name] = {"lambda": lam, "path": str(path), **manifest["metrics"], "example": first,
                      "eval": str(eval_path), "rouge1": metrics["rouge1"], "rouge2": metrics["rouge2"],
                      "rougeL": metrics["rougeL"], "novel_ngrams": metrics["novel_ngrams"],
                      "p_vs_first": metrics.get("against", {}).get("p")}
    summary = {"teacher": str(teacher), "data": str(data), "runs": runs}
    (output / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary
