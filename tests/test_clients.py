"""Real clients run `modelshrink export` folders and generate the runtime's tokens.

- transformers.js in Node loads a `--layout transformers.js` folder (tests/js/generate.mjs; install with
  `npm ci --prefix tests/js --ignore-scripts`): bart and t5 (float32; bart --int8, t5 --int4, 2-2-8 and 8-8-8
  quantize artifacts, their kernels chosen by measurement) and a classifier;
- Optimum's ORTModelForSeq2SeqLM loads the default layout (tests/optimum/generate.py): bart, t5, bert2bert and a
  classifier. optimum-onnx 0.1 needs transformers < 4.58, so it runs in the interpreter that MODELSHRINK_OPTIMUM_PYTHON
  names, one process for the session; there the runtime also loads Optimum's own exports.
Each client's tests skip, saying why, where the client is not installed. The searches are greedy (transformers.js
4.3 ignores num_beams; Optimum also runs beam 2): the tiny random models repeat one token, so one search bans repeats
(no_repeat_ngram_size=1), which makes every step's choice depend on the whole ranking of the logits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS, TRANSLATORS, translator
from modelshrink.artifacts import read_manifest, verify_files
from modelshrink.cli import app

runner = CliRunner()
TESTS = Path(__file__).resolve().parent
JS = TESTS / "js"
OPTIMUM_SCRIPT = TESTS / "optimum" / "generate.py"
OPTIMUM_PYTHON = "MODELSHRINK_OPTIMUM_PYTHON"
DOCS = DOCUMENTS[:5]
SEARCHES = [{"num_beams": 1, "max_length": 12}, {"num_beams": 1, "max_length": 12, "no_repeat_ngram_size": 1}]
FAST = ["--samples", "3", "--generation-docs", "2"]


@pytest.fixture(scope="module")
def exported(plain_models, classifier_path, tmp_path_factory):
    """export(model, layout, *flags): the folder, exported (without validation) on first use. model: a family,
    "classifier", or "bart-W-E-A", a `quantize` artifact (direct, no training) of the tiny BART."""
    root = tmp_path_factory.mktemp("client-exports")
    made: dict[tuple[str, ...], Path] = {}

    def source(model: str) -> Path:
        if model == "classifier":
            return classifier_path
        if model in TRANSLATORS:
            return translator(model, root / model) if not (root / model).exists() else root / model
        if "-" not in model:
            return plain_models[model]
        from modelshrink.steps.quantize import QuantizeOptions, quantize

        family, bits = model.split("-", 1)
        out = root / model
        if not out.exists():
            quantize(QuantizeOptions(model=str(plain_models[family]), bits=bits, method="direct", device="cpu"), out)
        return out

    def export(model: str, layout: str = "optimum", *flags: str) -> Path:
        key = (model, layout, *flags)
        if key not in made:
            out = root / ("export-" + "-".join(k.strip("-") for k in key))
            result = runner.invoke(app, ["export", str(source(model)), "-o", str(out), "--layout", layout,
                                         "--no-validate", *flags])
            assert result.exit_code == 0, result.output
            made[key] = out
        return made[key]

    return export


def _runtime_tokens(folder: Path, searches: list[dict]) -> tuple[list[list[int]], list[list[list[int]]]]:
    """(input ids of each document, [tokens of each document] for each search) by modelshrink.runtime."""
    from modelshrink.runtime import load

    model = load(folder)
    encoded = [model.encode([doc]) for doc in DOCS]
    ids = [e["input_ids"][0].tolist() for e in encoded]
    generated = [[model.generate_ids(e["input_ids"], e["attention_mask"], model.settings(**search))[0]
                  .tolist() for e in encoded] for search in searches]
    return ids, generated


def _pytorch_tokens(model_path: Path, ids: list[list[int]], searches: list[dict]) -> list[list[list[int]]]:
    import torch

    from modelshrink.generation.settings import generate_ids, resolve_generation
    from modelshrink.models.loading import load_seq2seq

    model, _, _ = load_seq2seq(str(model_path))
    out = []
    for search in searches:
        settings = resolve_generation(model.generation_config, num_beams=search["num_beams"],
                                      max_length=search["max_length"],
                                      no_repeat_ngram_size=search.get("no_repeat_ngram_size", 0))
        out.append([generate_ids(model, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long), settings)[0]
                    .tolist() for row in ids])
    return out


# ------------------------------------------------------------------ the layout itself (no client needed)

@pytest.mark.slow
def test_transformers_js_layout_validates_and_the_runtime_runs_it(plain_models, exported, docs_jsonl, tmp_path):
    out = tmp_path / "bart-js"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--layout", "transformers.js",
                                 *FAST])
    assert result.exit_code == 0, result.output  # validation loads the folder through the runtime
    assert sorted(p.name for p in (out / "onnx").iterdir()) == ["decoder_model_merged.onnx", "encoder_model.onnx"]
    assert not list(out.glob("*_model*.onnx")) and (out / "search_ops.onnx").is_file()
    assert json.loads((out / "config.json").read_text())["transformers.js_config"] == {"dtype": "fp32"}
    manifest = read_manifest(out)
    assert manifest["metrics"]["passed"] is True and verify_files(out) == []
    assert manifest["resolved"]["layout"] == "transformers.js"
    assert manifest["resolved"]["graphs"] == ["onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx"]
    optimum = exported("bart")
    assert manifest["resolved"]["parameters"] == read_manifest(optimum)["resolved"]["parameters"]
    runs = [runner.invoke(app, ["run", str(folder), "--input", str(docs_jsonl), "--limit", "3"])
            for folder in (out, optimum)]
    assert runs[0].exit_code == 0, runs[0].output
    assert runs[0].stdout == runs[1].stdout


@pytest.mark.slow
@pytest.mark.parametrize("flag, dtype, suffix", [("--int8", "q8", "_quantized"), ("--int4", "q4", "_q4")])
def test_quantized_graphs_take_transformers_js_names(exported, flag, dtype, suffix):
    from modelshrink.runtime import is_export, load

    # the kernel named: `auto` measures it at each export, and two exports on a busy machine may choose apart
    flag = (flag, "--kernel", "nbits")
    folder = exported("bart", "transformers.js", *flag)
    assert sorted(p.name for p in (folder / "onnx").iterdir()) == [f"decoder_model_merged{suffix}.onnx",
                                                                   f"encoder_model{suffix}.onnx"]
    assert json.loads((folder / "config.json").read_text())["transformers.js_config"] == {"dtype": dtype}
    assert is_export(folder)
    assert load(folder).summarize(DOCS[:2]) == load(exported("bart", "optimum", *flag)).summarize(DOCS[:2])


def _refused(args: list[str], out: Path, message: str) -> None:
    result = runner.invoke(app, ["export", *args, "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists() and not (out.parent / f".{out.name}.partial").exists()


def test_a_layout_for_a_family_its_client_cannot_run_is_refused(plain_models, tmp_path):
    _refused([str(plain_models["bert2bert"]), "--layout", "transformers.js"], tmp_path / "b2b",
             "transformers.js has no model for EncoderDecoderModel (bert2bert)")
    _refused([str(plain_models["t5"]), "--layout", "transformers.js", "--no-merge"], tmp_path / "pair",
             "needs the merged decoder")
    _refused([str(plain_models["t5"]), "--layout", "onnxruntime-genai"], tmp_path / "other", "--layout must be")


# ------------------------------------------------------------------ transformers.js (Node)

REQUIRE_CLIENTS = "MODELSHRINK_REQUIRE_CLIENTS"  # .ci/run sets it: there a missing client fails, never skips


def _missing(reason: str) -> None:
    """Skip, saying why and how to install the client; under .ci/run, fail instead."""
    if os.environ.get(REQUIRE_CLIENTS) == "1":
        pytest.fail(f"{REQUIRE_CLIENTS}=1 and a client is missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def transformers_js() -> Path:
    """The Node script, or a skip that says how to install what it needs."""
    if shutil.which("node") is None:
        _missing("node is not installed: transformers.js runs in Node 18+")
    pinned = json.loads((JS / "package.json").read_text())["dependencies"]["@huggingface/transformers"]
    installed = JS / "node_modules" / "@huggingface" / "transformers" / "package.json"
    if not installed.is_file():
        _missing(f"transformers.js {pinned} is not installed: npm ci --prefix tests/js --ignore-scripts")
    version = json.loads(installed.read_text())["version"]
    if version != pinned:
        _missing(f"tests/js has transformers.js {version}, not the pinned {pinned}: npm ci --prefix tests/js "
                 "--ignore-scripts")
    return JS / "generate.mjs"


def _node(script: Path, folder: Path, request: dict) -> dict:
    result = subprocess.run(["node", str(script), str(folder)], input=json.dumps(request), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("model, flags", [("bart", ()), ("t5", ()), ("bart", ("--int8",)), ("t5", ("--int4",)),
                                          ("bart-2-2-8", ()), ("marian", ()), ("mbart", ()), ("m2m_100", ())],
                         ids=["bart", "t5", "bart-int8", "t5-int4", "bart-2-2-8", "marian", "mbart", "m2m_100"])
def test_transformers_js_generates_the_runtimes_tokens(transformers_js, exported, plain_models, model, flags):
    folder = exported(model, "transformers.js", *flags)
    got = _node(transformers_js, folder, {"documents": DOCS, "searches": SEARCHES})
    ids, expected = _runtime_tokens(folder, SEARCHES)
    assert got["input_ids"] == ids  # transformers.js's tokenizer reads tokenizer.json as tokenizers does
    assert got["generated"] == expected
    assert all(len(set(row)) == len(row) for row in expected[1])  # the banned repeats did change the tokens
    if not flags and model in plain_models:
        assert expected == _pytorch_tokens(plain_models[model], ids, SEARCHES)


def _unpadded(rows: list[list[int]], pad: int) -> list[list[int]]:
    """Each generated row without the padding after its end (a batch pads its finished rows)."""
    out = []
    for row in rows:
        while len(row) > 1 and row[-1] == pad:
            row = row[:-1]
        out.append(row)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bart", "t5"])
def test_transformers_js_generates_a_padded_batch_as_the_runtime(transformers_js, exported, model):
    """Two documents of different lengths generated together (the shorter one padded): the same tokens as the
    runtime's padded batch. (transformers.js 4.3 ignores num_beams, so its searches are greedy; the runtime's
    beam search is checked against PyTorch in tests/test_runtime.py.)"""
    from modelshrink.runtime import load

    folder = exported(model, "transformers.js")
    documents = [DOCS[0], DOCS[0] + " " + DOCS[1]]
    got = _node(transformers_js, folder, {"documents": documents, "searches": SEARCHES, "batch": True})
    runtime = load(folder)
    encoded = runtime.encode(documents)
    assert len(set(map(len, got["input_ids"]))) == 2 and 0 in encoded["attention_mask"]  # padding happened
    assert got["input_ids"] == [[i for i, m in zip(ids, mask) if m] for ids, mask in
                                zip(encoded["input_ids"].tolist(), encoded["attention_mask"].tolist())]
    for search, batch in zip(SEARCHES, got["batch_generated"]):
        settings = runtime.settings(**search)
        ours = runtime.generate_ids(encoded["input_ids"], encoded["attention_mask"], settings).tolist()
        assert len(batch) == 2 and _unpadded(batch, settings.pad_token_id) == _unpadded(ours, settings.pad_token_id)


@pytest.mark.slow
def test_transformers_js_has_no_beam_search_yet(transformers_js, exported):
    """Why the client tests compare greedy searches only: transformers.js 4.3 takes num_beams but keeps the first
    candidate of each step ("TODO: Support beam search" in its generation loop, src/models/modeling_utils.js), so
    num_beams 4 gives its greedy tokens, while the runtime's beam 4 (PyTorch's, tests/test_runtime.py) differs.
    When a release searches beams, this fails: then its beam-4 tokens get compared with the runtime's."""
    from modelshrink.runtime import load

    folder = exported("bart", "transformers.js")
    beam = {"num_beams": 4, "max_length": 12}
    got = _node(transformers_js, folder, {"documents": DOCS, "searches": [SEARCHES[0], beam]})
    assert got["generated"][1] == got["generated"][0]  # beam 4 == greedy in transformers.js
    runtime = load(folder)
    encoded = [runtime.encode([doc]) for doc in DOCS]
    ours = [runtime.generate_ids(e["input_ids"], e["attention_mask"], runtime.settings(**beam)).tolist()[0]
            for e in encoded]
    assert ours != got["generated"][1]  # the runtime's beam search finds other tokens on these documents


@pytest.mark.slow
def test_transformers_js_runs_8_bit_quantize_artifacts_as_they_are(transformers_js, exported):
    # their 8-bit codes are unpacked by constant nodes that onnxruntime folds when it loads the graph (not
    # DequantizeLinear: onnxruntime's QDQ rewrite, Node 1.30 as Python 1.32, failed to load those with
    # "TransposeDQWeightsForMatMulNBits Missing required weight")
    folder = exported("bart-8-8-8", "transformers.js")
    assert (folder / "onnx" / "encoder_model_quantized.onnx").is_file()
    got = _node(transformers_js, folder, {"documents": DOCS, "searches": SEARCHES})
    assert [got["input_ids"], got["generated"]] == list(_runtime_tokens(folder, SEARCHES))


@pytest.mark.slow
def test_transformers_js_classifies_as_the_runtime(transformers_js, exported):
    from modelshrink.runtime import load

    folder = exported("classifier", "transformers.js")
    got = _node(transformers_js, folder, {"documents": DOCS})
    runtime = load(folder)
    np.testing.assert_allclose(got["logits"], [runtime.logits([doc])[0].tolist() for doc in DOCS], atol=1e-5)


# ------------------------------------------------------------------ Optimum (its own interpreter)

class OptimumProcess:
    """tests/optimum/generate.py in the Optimum interpreter, one process for the session's requests."""

    def __init__(self, python: str):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this environment's transformers 5
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([python, str(OPTIMUM_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=env)

    def __call__(self, request: dict, timeout: float = 600) -> dict:
        watchdog = threading.Timer(timeout, self.process.kill)  # a hung request fails its test, not the session
        watchdog.start()
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            for line in self.process.stdout:
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
                    assert "error" not in result, result["error"][-3000:]
                    return result
        finally:
            watchdog.cancel()
        self.log.seek(0)
        raise AssertionError(f"Optimum's process ended (code {self.process.wait()}): {self.log.read()[-3000:]}")

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


@pytest.fixture(scope="session")
def optimum():
    python = os.environ.get(OPTIMUM_PYTHON)
    if not python:
        _missing(f"{OPTIMUM_PYTHON} is not set: optimum-onnx 0.1 needs transformers < 4.58, so it needs its own "
                 f"environment: python -m venv --system-site-packages V && V/bin/pip install optimum-onnx==0.1.0 "
                 f"transformers==4.57.6, then {OPTIMUM_PYTHON}=V/bin/python")
    if shutil.which(python) is None:
        pytest.fail(f"{OPTIMUM_PYTHON}={python} is not an executable")
    process = OptimumProcess(python)
    yield process
    process.close()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bart", "t5", "bert2bert", "bart-2-2-8", "bart-8-8-8", "marian", "mbart",
                                   "m2m_100"])
def test_optimum_generates_the_runtimes_tokens(optimum, exported, plain_models, model):
    folder = exported(model)  # quantize artifacts: 2-bit codes (2-2-8), 8-bit codes (8-8-8)
    searches = [*SEARCHES, {"num_beams": 2, "max_length": 12}]
    ids, expected = _runtime_tokens(folder, searches)
    # the texts, through the folder's tokenizer as Optimum's users load it (transformers 4's AutoTokenizer)
    got = optimum({"folder": str(folder), "texts": DOCS, "searches": searches})
    assert got["input_ids"] == ids
    assert got["generated"] == expected
    if model in plain_models:
        assert expected == _pytorch_tokens(plain_models[model], ids, searches)


@pytest.mark.slow
def test_optimum_classifies_as_the_runtime(optimum, exported):
    from modelshrink.runtime import load

    folder = exported("classifier")
    runtime = load(folder)
    ids = [runtime.encode([doc])["input_ids"][0].tolist() for doc in DOCS]
    got = optimum({"folder": str(folder), "input_ids": ids, "classify": True})
    np.testing.assert_allclose(got["logits"], [runtime.logits([doc])[0].tolist() for doc in DOCS], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bart", "t5"])  # Optimum's exporter has no bert2bert with past
def test_the_runtime_runs_optimums_own_export(optimum, exported, plain_models, model, tmp_path):
    folder = tmp_path / f"optimum-{model}"
    optimum({"folder": str(plain_models[model]), "export": str(folder)})
    for name in ("tokenizer.json", "tokenizer_config.json"):  # transformers 4 cannot load a transformers 5 tokenizer
        shutil.copy(plain_models[model] / name, folder / name)
    assert _runtime_tokens(folder, SEARCHES) == _runtime_tokens(exported(model), SEARCHES)


def test_a_missing_client_fails_where_clients_are_required(monkeypatch):
    """.ci/run sets MODELSHRINK_REQUIRE_CLIENTS=1: there a client that is not installed fails the suite; anywhere
    else its tests skip, saying how to install it."""
    monkeypatch.setenv(REQUIRE_CLIENTS, "1")
    with pytest.raises(pytest.fail.Exception, match="a client is missing: node is not installed"):
        _missing("node is not installed")
    monkeypatch.delenv(REQUIRE_CLIENTS)
    with pytest.raises(pytest.skip.Exception, match="node is not installed"):
        _missing("node is not installed")
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "MODELSHRINK_REQUIRE_CLIENTS=1" in ci and ci.count("exit 1") >= 3
