"""Translation models through the whole chain: Marian, mBART and M2M100 (NLLB's architecture), tiny and random,
with a forced first token (the target-language code of mBART and M2M100) where the family has one: teacher labels
(sequence-level knowledge distillation), a student with fewer decoder layers, distillation-aware 8-8-8, the ONNX
export generating PyTorch's tokens, and BLEU/chrF of the export on source/target pairs."""

from __future__ import annotations

import pytest

from conftest import DOCUMENTS, SUMMARIES, TRANSLATORS, translator, write_jsonl

pytestmark = pytest.mark.slow  # end to end: see CONTRIBUTING.md, the fast loop

@pytest.mark.parametrize("family", sorted(TRANSLATORS))
def test_a_translator_goes_through_the_chain(family, tmp_path):
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.evaluate import EvalOptions, evaluate
    from modelshrink.steps.export import ExportOptions, export_model
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    teacher = translator(family, tmp_path / "teacher")
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"id": str(i), "source": s, "target": t}
                                                   for i, (s, t) in enumerate(zip(DOCUMENTS, SUMMARIES))])
    labels = pseudolabel(PseudolabelOptions(teacher=str(teacher), data=str(pairs), device="cpu"), tmp_path / "pl")
    rows = (labels / "data.jsonl").read_text().splitlines()
    assert len(rows) == len(DOCUMENTS)
    if TRANSLATORS[family][2]:  # the forced language code opens every output
        assert all('"summary": "data' in row for row in rows)
    student = distill(DistillOptions(data=str(labels), teacher=str(teacher), decoder_layers=1, max_steps=2,
                                     batch_size=2, device="cpu"), tmp_path / "student")
    quantized = quantize(QuantizeOptions(model=str(student), bits="8-8-8", method="distill", data=str(pairs),
                                         max_steps=1, batch_size=2, device="cpu"), tmp_path / "q")
    folder, report = export_model(ExportOptions(model=str(quantized), data=str(pairs), samples=2, generation_docs=2),
                                  tmp_path / "onnx")
    assert report["validation"]["generation"]["equal"], report["validation"]["generation"]
    # every card tells the Hub it translates (Marian and M2M100 by their type, mBART by its source/target data)
    from huggingface_hub import ModelCard

    assert {ModelCard.load(f / "README.md").data.pipeline_tag for f in (student, quantized, folder)} == {"translation"}
    _, metrics = evaluate(EvalOptions(model=str(folder), data=str(pairs), latency_docs=0, resamples=100),
                          tmp_path / "eval")
    assert metrics["task"] == "translation" and metrics["documents"] == len(DOCUMENTS)
    assert 0 <= metrics["bleu"] <= 100 and 0 <= metrics["chrf"] <= 100


def test_a_translator_is_validated_and_kept_by_bleu(tmp_path):
    import json

    from modelshrink.steps.distill import DistillOptions, distill

    teacher = translator("marian", tmp_path / "teacher")
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"id": str(i), "source": s, "target": t}
                                                   for i, (s, t) in enumerate(zip(DOCUMENTS, SUMMARIES))])
    student = distill(DistillOptions(data=str(pairs), teacher=str(teacher), decoder_layers=1, max_steps=3,
                                     batch_size=4, validation=str(pairs), eval_every=1, eval_limit=4, metric="bleu",
                                     device="cpu"), tmp_path / "student")
    rows = [json.loads(line) for line in (student / "train_log.jsonl").read_text().splitlines()]
    checks = [r for r in rows if r.get("event") == "validation"]
    assert len(checks) == 3 and all({"bleu", "chrf", "rouge2"} <= set(r) for r in checks)
    best = json.loads((student / "validation.json").read_text())
    assert best["metric"] == "bleu" and best["bleu"] == max(r["bleu"] for r in checks)
    assert best["step"] == next(r["step"] for r in checks if r["bleu"] == best["bleu"])  # the first of the best
