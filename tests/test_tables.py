"""recipes/tables.py prints REPRODUCTION.md's tables from the artifacts a recipe wrote: here a DQ-BART folder
made by hand (metrics, manifests, a training log), read back as rows, paired tests and loss windows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TABLES = Path(__file__).resolve().parents[1] / "recipes" / "tables.py"


def _metrics(rouge: float, against: dict | None = None, size: int | None = None) -> dict:
    m = {key: rouge for key in ("rouge1", "rouge2", "rougeL")}
    m["ci95"] = {key: [rouge - 1, rouge + 1] for key in ("rouge1", "rouge2", "rougeL")}
    if size:
        m["efficiency"] = {"bytes_on_disk": size}
    if against:
        m["against"] = against
    return m


def _tables(*args: str) -> str:
    """recipes/tables.py's stdout, run in this process (a subprocess would import torch again for each table)."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("recipes_tables", TABLES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.main(list(args))
    return out.getvalue()


def _write(path: Path, data: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    name = "metrics.json" if path.name.startswith("eval-") else "modelshrink.json"
    (path / name).write_text(json.dumps(data))


def test_dqbart_rows_pairs_clamped_rows_and_loss_windows(tmp_path):
    folder = tmp_path / "dq-bart"
    _write(folder / "eval-float", _metrics(40.0, size=200_000_000))
    gap = {"delta": {"rouge1": -17.5, "rouge2": -1.0, "rougeL": -16.25}, "p": {"rouge1": 0.0001, "rouge2": 0.2,
                                                                             "rougeL": 0.0001}}
    for key, rouge in (("888-direct", 39.0), ("888-direct-clip", 22.5), ("888-6-6-clip", 40.25)):
        _write(folder / f"eval-{key}", _metrics(rouge, against=gap))  # re-scored: no efficiency, manifest bytes
        _write(folder / key, {"metrics": {"bytes_on_disk": 50_000_000, "bytes_at_nominal_bits": 50_000_000}})
    _write(folder / "eval-888-direct-clip-vs-888-direct", _metrics(22.5, against=gap))
    log = [{"step": step, "loss": 5.0 - step / 100, "kd_hidden": 1.0} for step in range(10, 301, 10)]
    log += [{"step": step, "event": "validation", "rougeL": score, "best_step": 120}
            for step, score in ((60, 30.5), (120, 38.675), (180, 37.0))]
    (folder / "888-6-6-clip" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    out = _tables("dqbart", str(tmp_path), "--figures", str(tmp_path / "f"))
    assert "| 8-8-8 6-6, direct, clamp ±2.5 | 50.0 | 4.0× | 50.0 | 4.0× | 22.50 [21.50, 23.50] |" in out
    assert "-16.25 (< 0.001*)" in out and "| 8-8-8 6-6, direct, clamp ±2.5 against 8-8-8 6-6, direct |" in out
    assert "2-2-8 6-6, distillation-aware" not in out  # rows without an evaluation are left out
    # the last four windows of 50 steps, means of the logged loss: steps 101-150 log 5 - 1.1 .. 5 - 1.5 (mean 3.7)
    assert "| model | steps 101-150 | steps 151-200 | steps 201-250 | steps 251-300 |" in out
    assert "| 8-8-8 6-6, distillation-aware, clamp ±2.5, total | 3.70 | 3.20 | 2.70 | 2.20 |" in out
    # the held-out curve that chose the checkpoint, and its best point
    assert "| 8-8-8 6-6, distillation-aware, clamp ±2.5 | 60: 30.50, 120: 38.67, 180: 37.00 | 38.67 at step 120 |" in out


def test_dqbart_mt_rows_bleu_chrf_and_the_papers_table_2(tmp_path):
    folder = tmp_path / "dq-bart"

    def bleu(score: float, against: dict | None = None, size: int | None = None) -> dict:
        m = {"bleu": score, "chrf": score + 20, "ci95": {"bleu": [score - 1, score + 1], "chrf": [score + 19, score + 21]}}
        m.update({"efficiency": {"bytes_on_disk": size}} if size else {})
        m.update({"against": against} if against else {})
        return m

    _write(folder / "eval-float", bleu(30.0, size=50_000_000))
    gap = {"delta": {"bleu": -29.5, "chrf": -40.0}, "p": {"bleu": 0.0001, "chrf": 0.0001}}
    _write(folder / "eval-888-direct", bleu(0.5, against=gap))
    _write(folder / "888-direct", {"metrics": {"bytes_on_disk": 12_500_000}})
    _write(folder / "eval-888-6-6-vs-888-direct", bleu(29.0, against={"delta": {"bleu": 28.5, "chrf": 30.0},
                                                                      "p": {"bleu": 0.0001, "chrf": 0.0001}}))
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 250, "loss": 4.0}, {"step": 250, "event": "validation", "bleu": 5.36, "best_step": 250},
        {"step": 500, "event": "validation", "bleu": 11.89, "best_step": 500})))
    out = _tables("dqbart-mt", str(tmp_path), "--figures", str(tmp_path / "f"))
    assert "| 32-32-32 6-6 (the teacher) | 250: 5.36, 500: 11.89 | 11.89 at step 500 |" in out
    assert "| 32-32-32 6-6 (the teacher) | 50.0 | 1.0× | 30.00 [29.00, 31.00] | 50.00 [49.00, 51.00] | – | – | " \
           "12-12 / 1x / 26.82 |" in out
    assert "| 8-8-8 6-6, direct | 12.5 | 4.0× | 0.50 [-0.50, 1.50] | 20.50 [19.50, 21.50] | -29.50 (< 0.001*) | " \
           "-40.00 (< 0.001*) | 12-12 / 4.0x / 0.01 |" in out
    assert "| 8-8-8 6-6, distillation-aware against 8-8-8 6-6, direct | +28.50 (< 0.001*) | +30.00 (< 0.001*) |" in out
    assert "2-2-8 6-6" not in out.split("| compared")[0]  # rows without an evaluation are left out


def _quickstart_table():
    import importlib.util

    spec = importlib.util.spec_from_file_location("quickstart_table", TABLES.parent / "quickstart_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readmes_quickstart_table_is_the_recorded_runs():
    result = subprocess.run([sys.executable, str(TABLES.parent / "quickstart_table.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_quickstart_summary_is_printed_and_only_written_when_asked(tmp_path, monkeypatch, capsys):
    qt = _quickstart_table()
    readme, record = tmp_path / "README.md", tmp_path / "quickstart.json"
    readme.write_text(f"intro\n{qt.START}\n| old |\n{qt.END}\nafter\n")
    monkeypatch.setattr(qt, "README", readme)
    monkeypatch.setattr(qt, "RECORD", record)
    systems = [{"name": "eval-teacher", "rouge1": 14.004, "rouge2": 2.0, "rougeL": 13.5, "p_vs_first": {},
                "length_words": 7.04, "parameters": 49_012_345, "bytes_on_disk": 196_140_000, "latency_ms_p50": 763.6},
               {"name": "eval-student-lambda2-2-2-8", "rouge1": 11.26, "rouge2": 0.31, "rougeL": 11.09,
                "p_vs_first": {"rouge1": 0.01, "rouge2": 0.2, "rougeL": 0.049}, "length_words": 6.66,
                "parameters": 39_500_000, "bytes_on_disk": 10_010_000, "latency_ms_p50": None}]
    run = tmp_path / "run"
    run.mkdir()
    export = {"folder": "modelshrink-quickstart/export", "check": "passed"}
    (run / "summary.json").write_text(json.dumps({"comparison": {"systems": systems}, "export": export}))
    readme_before = readme.read_text()
    assert qt.main([str(run)]) == 0  # without --write: the run's table and its export, nothing written
    printed = capsys.readouterr().out
    assert readme.read_text() == readme_before and not record.exists()
    assert "| λ = 2 student, 2-2-8 | 11.26* | 0.31 | 11.09* | 6.7 | 39.5 M | 10.0 | – |" in printed
    assert "modelshrink run modelshrink-quickstart/export --input" in printed
    assert qt.main([str(run), "--write"]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{qt.END}\nafter\n")
    lines = qt.readme_table(text).splitlines()
    assert lines[2] == "| teacher (bert2bert 6-6) | 14.00 | 2.00 | 13.50 | 7.0 | 49.0 M | 196.1 | 764 ms |"
    assert lines[3] == "| λ = 2 student, 2-2-8 | 11.26* | 0.31 | 11.09* | 6.7 | 39.5 M | 10.0 | – |"
    assert qt.main(["--check"]) == 0
    readme.write_text(text.replace("11.26*", "11.53*"))  # a table edited by hand no longer passes
    assert qt.main(["--check"]) == 1


def test_teacher_table_prints_both_lead_baselines_and_the_teachers_style(tmp_path):
    """REPRODUCTION.md's teacher section cites the first-8-words baseline and the teacher's style against the
    references: both come from the artifacts (recipes/teacher-debian.sh, recipes/eval-lead-baselines.sh)."""
    p = {"delta": {}, "p": {"rouge1": 0.003, "rouge2": 0.0001, "rougeL": 0.52}}
    style = {"novel_ngrams": {"1": 18.3, "2": 50.0, "3": 70.0, "4": 80.0}, "copy_bias": 13.8, "leading_bias": 70.7}
    teacher = {**_metrics(43.0, against={"delta": {}, "p": dict.fromkeys(("rouge1", "rouge2", "rougeL"), 0.0001)}),
               "length_words": 6.4, "documents": 2055, **style,
               "reference_style": {"length_words": 6.5, "novel_ngrams": {"1": 26.4}, "copy_bias": 11.6,
                                   "leading_bias": 69.6}}
    for path, data in ((tmp_path / "teacher-eval", teacher),
                       (tmp_path / "lead" / "eval-lead-sentence", {**_metrics(30.0), "length_words": 16.6}),
                       (tmp_path / "lead" / "eval-lead-8-words", {**_metrics(29.0, against=p), "length_words": 8.0})):
        path.mkdir(parents=True)
        (path / "metrics.json").write_text(json.dumps(data))
    (tmp_path / "teacher").mkdir()
    log = [{"step": 250, "epoch": 0.17, "loss": 5.25}, {"step": 250, "event": "validation", "rouge1": 24.9,
                                                        "rouge2": 8.0, "rougeL": 23.8}]
    (tmp_path / "teacher" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    out = _tables("teacher", str(tmp_path))
    assert "| first sentence of the document | 30.00 [29.00, 31.00] | 30.00 [29.00, 31.00] | 30.00 [29.00, 31.00] " \
           "| 16.6 |  |" in out
    assert "| first 8 words | 29.00 [28.00, 30.00] | 29.00 [28.00, 30.00] | 29.00 [28.00, 30.00] | 8.0 | " \
           "0.003*, < 0.001*, 0.520 |" in out
    assert "| teacher (bert2bert 6-6) | 43.00 [42.00, 44.00] |" in out and "< 0.001*, < 0.001*, < 0.001* |" in out
    assert ("Style (references in brackets): 6.4 words (6.5), 18.3% novel unigrams (26.4%), 13.8% of 4-grams "
            "copied (11.6%), 70.7% leading bias (69.6%).") in out
    assert "| 250 | 0.17 | 5.250 | 24.90 | 8.00 | 23.80 |" in out


def test_ackd_table_keeps_each_models_predictions_and_tables_seeds_recorded_by_another_session(tmp_path):
    """Seeds trained in two sessions make one table: the first session's weights are gone, its record is not."""
    import shutil

    from conftest import bert_tokenizer, save_classifier

    data = tmp_path / "data"
    data.mkdir()
    words = ["good", "bad", "fine", "dull", "great", "awful"]
    rows = [{"sentence": f"{words[i % 6]} {words[(i * 5) % 6]} film", "label": i % 2} for i in range(24)]
    (data / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = bert_tokenizer()

    def model(path: Path, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        save_classifier(path, tok)
        (path / "modelshrink.json").write_text("{}")

    first, second, record = tmp_path / "first", tmp_path / "second", tmp_path / "record"
    model(first / "teacher", 0)
    (first / "teacher" / "modelshrink.json").write_text(json.dumps(  # its training's best validation
        {"metrics": {"steps": 747, "validation": {"step": 372, "accuracy": 87.6686, "f1": 87.3767, "mcc": 75.3559}}}))
    for name, seed in (("ce", 1), ("kd", 2)):
        model(first / "seed-0" / f"student-{name}", seed)
        model(second / "seed-1" / f"student-{name}", seed + 10)
    common = ["--data", str(data), "--record", str(record), "--figures", str(tmp_path / "figures")]
    one = _tables("ackd", str(first), *common)
    assert (record / "teacher.json").is_file() and (record / "seed-0" / "student-kd.json").is_file()
    kept = json.loads((record / "seed-0" / "student-ce.json").read_text())
    assert len(kept["predicted"]) == len(rows) and set(kept["predicted"]) <= {0, 1}
    assert "| CE only | 1 |" in one and "(best checkpoint: step 372 of 747, F1 87.38, MCC 75.36)." in one
    assert "Training sentences by class" not in one  # no train.jsonl beside the validation sentences
    header = next(line for line in one.splitlines() if line.startswith("| student |"))
    assert "| p vs ACKD |" in header  # Fig. 3 compares each ablation with ACKD
    assert all(line.count("|") == header.count("|") for line in one.splitlines() if line.startswith("| CE only"))
    shutil.rmtree(first)  # the first session's weights are gone
    # four sentences of each class and one more of class 0
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:8] + rows[:1]))
    both = _tables("ackd", str(second), *common, "--teacher", str(tmp_path / "none"))
    assert "Training sentences by class: 0: 55.6%, 1: 44.4%" in both
    assert "| CE only | 2 |" in both and "| KD (CE + KD) | 2 |" in both
    per_seed = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in one.splitlines()
                if line.startswith("| CE only") or line.startswith("| KD (CE + KD)")}
    for name, values in per_seed.items():  # seed 0's accuracy, from the record, is the first of the two
        row = next(line for line in both.splitlines() if line.startswith(f"| {name} |"))
        assert row.split("|")[4].strip().startswith(values + ", ")
    # the teacher's accuracy, from its record (its F1 and MCC come from its manifest, gone with its weights)
    assert one.splitlines()[0].split(" (best")[0] == both.splitlines()[0].removesuffix(".")
    # without --record nothing is read from it
    assert "| CE only | 1 |" in _tables("ackd", str(second), "--data", str(data), "--figures", str(tmp_path / "f2"))
    # a follow-up ACKD student is set against the KD + PT student of its own features (the kd-pt-mean control)
    assert "the same features without A-CDL" not in both
    for name, seed in (("kd-pt-mean", 21), ("ackd-mean-tau01", 22)):
        model(second / "seed-1" / f"student-{name}", seed)
    control = _tables("ackd", str(second), "--data", str(data), "--figures", str(tmp_path / "f3"))
    line = next(line for line in control.splitlines() if "the same features without A-CDL" in line)
    assert line.startswith("ACKD, mean-pooled, τ 0.1, γ 5e-2 against KD + PT, mean-pooled features") and "p = " in line


def test_plate_table_of_the_long_documents_keeps_the_short_runs_figure(tmp_path):
    """`plate --long` tables RUNS/plate-long and draws plate-long-fig2.png: the short documents' Fig. 2 in the same
    figures folder (REPRODUCTION.md's reproduction/plate-fig2.png) is left as it is."""
    runs, figures = tmp_path / "runs", tmp_path / "figures"
    style = {"length_words": 6.3, "novel_ngrams": {k: 20.0 for k in "1234"}, "copy_bias": 7.8, "leading_bias": 64.3,
             "rouge1": 40.86}
    (runs / "plate-long" / "labels-regular-style").mkdir(parents=True)
    (runs / "plate-long" / "labels-regular-style" / "metrics.json").write_text(
        json.dumps({**style, "reference_style": style}))
    bins = ["(0.0, 0.2]", "(0.2, 0.4]", "(0.4, 0.6]", "(0.6, 0.8]", "(0.8, 1.0]"]
    attention = {"evident_share_by_bin": [69, 6, 5, 8, 12], "bins": bins, "evident_share_of_all_weights": 0.1,
                 "evident_share_of_attention_mass": 7.9}
    _write(runs / "plate-long" / "labels-regular", {"metrics": {"attention": attention}})
    figures.mkdir()
    (figures / "plate-fig2.png").write_bytes(b"the short documents' figure")
    for split, lengths in (("train", (120, 200)), ("validation", (130,))):
        (runs / "plate-long" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"id": str(n), "document": "word " * n}) + "\n" for n in lengths))
    out = _tables("plate", str(runs), "--long", "--figures", str(figures))
    assert ("Long documents: 2 train documents of 160 words on average, 1 validation documents of 130 words on "
            "average") in out
    assert "| λ = 1 (regular) | 6.30 |" in out and "69 / 6 / 5 / 8 / 12" in out
    assert (figures / "plate-fig2.png").read_bytes() == b"the short documents' figure"
    assert (figures / "plate-long-fig2.png").stat().st_size > 0 and "plate-long-fig2.png" in out
    # Table 2: the students, and the teacher on the same documents for scale, tested against the Regular student
    style = {"length_words": 6.2, "novel_ngrams": {k: 23.8 for k in "1234"}, "copy_bias": 9.6,
             "leading_bias": 64.4}
    _write(runs / "plate-long" / "eval-regular", {**_metrics(32.53), **style,
                                                  "attention": {**attention, "evident_share_by_bin": [72, 6, 3, 5, 13]}})
    assert "the teacher" not in _tables("plate", str(runs), "--long", "--figures", str(figures))
    against = {"delta": {k: 4.74 for k in ("rouge1", "rouge2", "rougeL")},
               "p": {k: 0.0023 for k in ("rouge1", "rouge2", "rougeL")}}
    _write(runs / "plate-long" / "eval-teacher", {**_metrics(37.27, against), **style})
    rows = _tables("plate", str(runs), "--long", "--figures", str(figures)).splitlines()
    assert rows[-2].startswith("| λ = 1 (regular) | 32.53 [31.53, 33.53] |")
    assert rows[-2].endswith("| 6.20 | 23.8 | 9.6 | 64.4 | 72 / 6 / 3 / 5 / 13 |")
    assert rows[-1].endswith("| 9.6 | 64.4 | – |")  # no attention recorded for the teacher here
    assert rows[-1].startswith("| *the teacher (6-6), for scale* | 37.27 [36.27, 38.27] |")
    assert "+4.74 (0.002*)" in rows[-1]


def test_plate_table_pools_the_seeds_of_a_student_against_regular_of_the_same_seed(tmp_path):
    """Students at two seeds (the recipe's SEEDS=1 adds -seed1 names): R-1 by seed, Δ against Regular of the same
    seed, and one paired test over both seeds' documents; a student at one seed only gets no pooled row, and two
    evaluations of different documents are refused."""
    folder = tmp_path / "runs" / "plate-long"
    style = {"length_words": 6.0, "novel_ngrams": {k: 20.0 for k in "1234"}, "copy_bias": 5.0, "leading_bias": 60.0}

    def evaluation(name: str, scores: list[float], ids: list[str] | None = None) -> None:
        _write(folder / name, {**_metrics(sum(scores) / len(scores)), **style})
        ids = ids or [f"doc{i}" for i in range(len(scores))]
        (folder / name / "predictions.jsonl").write_text("".join(
            json.dumps({"id": i, "scores": {k: s for k in ("rouge1", "rouge2", "rougeL")}}) + "\n"
            for i, s in zip(ids, scores)))

    evaluation("eval-regular", [30.0] * 20)
    evaluation("eval-regular-seed1", [32.0] * 20)
    evaluation("eval-gold", [31.0] * 20)  # +1 on every document at both seeds: significant pooled
    evaluation("eval-gold-seed1", [33.0] * 20)
    evaluation("eval-random", [29.0] * 20)  # one seed only
    out = _tables("plate", str(tmp_path / "runs"), "--long", "--figures", str(tmp_path / "figures"))
    pooled = [line for line in out.splitlines() if line.startswith("| gold synopses | 2 |")]
    assert pooled == ["| gold synopses | 2 | 31.00, 33.00 | 30.00, 32.00 | +1.00, +1.00 | +1.00 (< 0.001*) | "
                      "+1.00 (< 0.001*) | +1.00 (< 0.001*) |"]
    assert not any(line.startswith("| λ ~ U[1, 2] | ") and "| 2 |" in line for line in out.splitlines())
    # the recipe's second learning rate (LRS="3e-4 5e-5" adds -lr5e-5 names): its own rows, labelled whole
    evaluation("eval-regular-lr5e-5", [30.0] * 20)
    evaluation("eval-gold-lr5e-5", [30.5] * 20)
    evaluation("eval-gold-lr5e-5-seed1", [30.0] * 20)
    evaluation("eval-regular-lr5e-5-seed1", [30.0] * 20)
    lines = _tables("plate", str(tmp_path / "runs"), "--long", "--figures", str(tmp_path / "figures")).splitlines()
    assert any(line.startswith("| gold synopses (lr 5e-5) | 30.50 ") for line in lines)
    assert any(line.startswith("| gold synopses (lr 5e-5, seed 1) | 30.00 ") for line in lines)
    assert any(line.startswith("| gold synopses (seed 1) | 33.00 ") for line in lines)
    assert [line for line in lines if line.startswith("| gold synopses (lr 5e-5) | 2 |")] == [
        "| gold synopses (lr 5e-5) | 2 | 30.50, 30.00 | 30.00, 30.00 | +0.50, +0.00 | +0.25 (< 0.001*) | "
        "+0.25 (< 0.001*) | +0.25 (< 0.001*) |"]
    evaluation("eval-gold-seed1", [33.0] * 20, ids=[f"other{i}" for i in range(20)])
    with pytest.raises(SystemExit, match="different documents"):
        _tables("plate", str(tmp_path / "runs"), "--long", "--figures", str(tmp_path / "figures"))
