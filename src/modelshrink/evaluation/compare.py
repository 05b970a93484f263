"""`eval --compare`: several systems side by side, significance against the first, and a PNG of
quality against footprint (DQ-BART Fig. 1 style)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from modelshrink.artifacts import ArtifactWriter, parent_ref, read_manifest
from modelshrink.errors import UserError
from modelshrink.metrics.names import CLASSIFICATION_METRICS, REGRESSION_METRICS, ROUGE_METRICS, TRANSLATION_METRICS
from modelshrink.evaluation.predictions import eval_rows
from modelshrink.evaluation.scoring import paired_corpus_tests, paired_keys, paired_tests

QUALITY = {"summarization": list(ROUGE_METRICS), "translation": list(TRANSLATION_METRICS),
           "classification": list(CLASSIFICATION_METRICS), "regression": list(REGRESSION_METRICS)}
PLOTTED = {"summarization": "rougeL", "translation": "bleu", "classification": "accuracy", "regression": "pearson"}


def _have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _load_eval(path: Path) -> dict[str, Any]:
    metrics = json.loads((path / "metrics.json").read_text())
    return {"name": path.name, "path": str(path), "metrics": metrics, "rows": eval_rows(path)}


def compare(entries: list[str], output: str | Path, *, evaluate_model: Callable[[str, Path], Path] | None = None,
            overwrite: bool = False, significance: str = "permutation", resamples: int = 10000, seed: int = 0,
            log: Callable[[str], None] = lambda m: None) -> tuple[Path, dict[str, Any]]:
    """Compare eval artifacts (or models, evaluated first by `evaluate_model(model, folder)`)."""
    if len(entries) < 2:
        raise UserError("--compare needs at least two eval artifacts or models")
    writer = ArtifactWriter(output, overwrite=overwrite)
    writer.check()
    for entry in entries:
        manifest = read_manifest(entry) if Path(entry).is_dir() else None
        is_model = Path(entry, "config.json").is_file()
        if (manifest is None or manifest.get("kind") != "eval") and not is_model:
            raise UserError(f"--compare: {entry} is neither an eval artifact nor a model folder")
        if is_model and (manifest is None or manifest.get("kind") != "eval") and evaluate_model is None:
            raise UserError(f"--compare: {entry} is a model; give DATA (--data) to evaluate it first")
    with writer:
        systems = []
        for i, entry in enumerate(entries):
            manifest = read_manifest(entry) if Path(entry).is_dir() else None
            if manifest is not None and manifest.get("kind") == "eval":
                systems.append(_load_eval(Path(entry)))
            else:
                log(f"evaluating {entry}")
                evaluated = evaluate_model(entry, writer.staging / f"eval-{i}-{Path(entry).name}")
                systems.append({**_load_eval(evaluated), "name": Path(entry).name})
        tasks = {s["metrics"]["task"] for s in systems}
        if len(tasks) != 1:
            raise UserError(f"--compare: the systems are of different tasks ({', '.join(sorted(tasks))})")
        task = tasks.pop()
        first = systems[0]
        ids = list(first["rows"])
        for s in systems[1:]:
            if set(s["rows"]) != set(ids):
                raise UserError(f"--compare: {s['path']} and {first['path']} were not evaluated on the same "
                                "documents (ids differ)")
        keys = QUALITY[task]
        per_doc_keys = paired_keys(task, next(iter(first["rows"].values())))
        first_rows = [first["rows"][i] for i in ids]
        table = []
        for s in systems:
            m = s["metrics"]
            eff = m.get("efficiency", {})
            row = {"name": s["name"], "path": s["path"], **{k: m.get(k) for k in keys},
                   "length_words": m.get("length_words"), "parameters": eff.get("parameters"),
                   "bytes_on_disk": eff.get("bytes_on_disk"), "latency_ms_p50": eff.get("latency_ms_p50"),
                   "p_vs_first": {}}
            if s is not first and task == "translation":  # corpus BLEU and chrF: the test swaps sentences' statistics
                row["p_vs_first"] = paired_corpus_tests([s["rows"][i] for i in ids], first_rows, significance,
                                                        resamples, seed)["p"]
            elif s is not first:
                row["p_vs_first"] = paired_tests([s["rows"][i] for i in ids], first_rows, per_doc_keys,
                                                 significance, resamples, seed)["p"]
            table.append(row)
        result = {"task": task, "significance": {"method": significance, "resamples": resamples, "seed": seed,
                                                 "against": first["name"]}, "systems": table}
        points = [(r["name"], r["bytes_on_disk"], r[PLOTTED[task]]) for r in table if r["bytes_on_disk"]]
        if points and not _have_matplotlib():
            log("note: no quality-vs-footprint figure: matplotlib is not installed (pip install 'modelshrink[plot]')")
        elif points:
            from modelshrink.figures import quality_vs_footprint

            quality_vs_footprint(points, writer.staging / "quality-vs-footprint.png", PLOTTED[task])
            result["figure"] = "quality-vs-footprint.png"
        else:
            log("note: no system has a size on disk (all are predictions files), so no quality-vs-footprint figure")
        (writer.staging / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
        options = {"compare": entries, "significance": significance, "significance_resamples": resamples,
                   "seed": seed}
        path = writer.commit(step="eval", kind="comparison", options=options,
                             parents=[parent_ref("system", e) for e in entries], metrics={"systems": len(table)})
    return path, result
