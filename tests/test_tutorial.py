"""docs/getting-started/compress-your-own.md, run: each tour's commands, as a user types them, in a shell, on Hub
names that a Hugging Face cache holds (the kits of tests/hub_kits.py: the real checkpoints' files, shrunk, random
weights), offline. Only the training lengths, the student's depth (`SHORTER`) and the generation config's lengths
(16 tokens) are shortened."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_jsonl
from hub_kits import CHECKPOINTS, build_kit
from test_docs import FENCE, SHELL, _shell_lines

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHECKPOINTS.is_dir(), reason="../shared/checkpoints is absent")]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started" / "compress-your-own.md"
SAMPLE = Path(__file__).resolve().parents[1] / "src" / "modelshrink" / "samples" / "debian" / "validation.jsonl"
# the tour (its heading) -> the Hub names its commands use, and the kit each one is in the cache as
TOURS = {"A summarizer": {"facebook/bart-large-cnn": "facebook--bart-large-cnn"},
         "A translator": {"facebook/m2m100_418M": "facebook--m2m100_418M"},
         "A classifier": {"google-bert/bert-base-uncased": "google-bert--bert-base-uncased"}}
# what the test shortens: the page trains for real, the kits have 2 decoder layers and 3 encoder layers
SHORTER = {r"--epochs \d+": "--max-steps 1", r"--decoder-layers 3": "--decoder-layers 1", r"--layers 4": "--layers 2"}


def _tour(heading: str) -> list[str]:
    """The shell lines of the page's section whose heading starts with `heading`."""
    text = PAGE.read_text(encoding="utf-8")
    section = re.search(rf"^## {re.escape(heading)}.*?(?=^## |\Z)", text, re.S | re.M)
    assert section, f"{PAGE.name} has no section '{heading}'"
    lines = [line for fence in FENCE.finditer(section[0]) if fence[1] in SHELL for line in _shell_lines(fence[2])]
    assert lines and all(line.startswith("modelshrink ") for line in lines), lines
    return lines


def _cache(root: Path, names: dict[str, str]) -> Path:
    """A Hugging Face hub cache holding each kit under its Hub name (the layout huggingface_hub reads offline)."""
    commit = "0" * 40
    for hub_name, kit in names.items():
        repo = root / f"models--{hub_name.replace('/', '--')}"
        build_kit(kit, repo / "snapshots" / commit, max_length=16)
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
    return root


def _data(folder: Path) -> None:
    """The files the page names: documents (with gold summaries for eval), pairs, labelled sentences."""
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()[:2]]
    write_jsonl(folder / "my-docs.jsonl", [{"id": r["id"], "document": r["document"]} for r in rows])
    write_jsonl(folder / "my-validation.jsonl", rows)
    write_jsonl(folder / "my-pairs.jsonl", [{"source": "A free library for reading documents.",
                                             "target": "Eine freie Bibliothek zum Lesen von Dokumenten."},
                                            {"source": "Command line tools.", "target": "Kommandozeilenwerkzeuge."}])
    sentences = [("a tender and moving film", 1), ("dull, lifeless and far too long", 0)] * 4
    write_jsonl(folder / "my-sentences.jsonl", [{"sentence": s, "label": y} for s, y in sentences])


@pytest.mark.parametrize("heading", sorted(TOURS))
def test_the_tutorials_commands_run_as_written(heading, tmp_path):
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)  # the page's `mkdir -p runs`
    _data(work)
    env = {**os.environ, "HF_HUB_CACHE": str(_cache(tmp_path / "hub", TOURS[heading])), "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line in _tour(heading):
        for pattern, shorter in SHORTER.items():
            line = re.sub(pattern, shorter, line)
        done = subprocess.run(["bash", "-c", f"set -o pipefail; {line}"], cwd=work, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
    # each tour ends with a served folder's outputs and an evaluation
    served = [p for p in work.iterdir() if p.name in ("summaries.jsonl", "german.jsonl", "labels.jsonl")]
    assert len(served) == 1 and served[0].read_text().count("\n") >= 2, served
    assert any((work / "runs").glob("eval*/metrics.json"))
