"""Contracts every step keeps: options declared once and replayable, one validation schema, resume of
a finished output is a no-op, and no import cycle inside the package."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shlex
import typing
from pathlib import Path
from typing import Any

import click
import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS, SUMMARIES, save_classifier, bert_tokenizer, write_jsonl
from modelshrink.artifacts import read_manifest, sha256_file
from modelshrink.cli import app
from modelshrink.commands._from_options import OPTIONS_OF
from modelshrink.errors import UserError
from modelshrink.options import flag_of, key_of, spec_of, to_toml
from modelshrink.options.contrastive import ContrastiveOptions
from modelshrink.options.distill import DistillOptions
from modelshrink.options.eval import EvalOptions
from modelshrink.options.export import ExportOptions
from modelshrink.options.pseudolabel import PseudolabelOptions
from modelshrink.options.quantize import QuantizeOptions
from modelshrink.options.quickstart import QuickstartOptions

runner = CliRunner()
SRC = Path(__file__).resolve().parents[1] / "src" / "modelshrink"

# One instance per step with options away from their defaults: lists, tuples, negated flags, floats.
EXAMPLES = {
    "pseudolabel": PseudolabelOptions(teacher="runs/teacher", data="train.jsonl", lambda_range=(1.0, 2.0),
                                      num_beams=3, no_repeat_ngram_size=2, do_sample=False, limit=7, seed=3),
    "distill": DistillOptions(data="pairs.jsonl", teacher="runs/teacher", encoder_layer_ids=[0, 2, 5],
                              decoder_layers=2, kd_logits="kl", temperature=1.5, max_steps=10, lr=3e-4,
                              validation="valid.jsonl", eval_every=5, trust_remote_code=True, precision="bf16",
                              gradient_checkpointing=True),
    "quantize": QuantizeOptions(model="runs/student", bits="2-2-8", granularity="row", data="pairs.jsonl",
                                decoder_layers=1, kd_attention=0.5, max_steps=4, validation="valid.jsonl", metric="rougeL"),
    "contrastive": ContrastiveOptions(data="train.jsonl", teacher="runs/teacher", layer_ids=[0, 2], sar=False,
                                      storage=False, gamma=5e-2, epochs=1.5, max_tokens=512),
    "eval": EvalOptions(model="runs/student", data="valid.jsonl", against="runs/eval-base",
                        limited_length_recall=True, latency_docs=0, resamples=200),
    "export": ExportOptions(model="runs/student", int8=True, per_channel=False, merge=False, opset=15),
    "quickstart": QuickstartOptions(teacher_steps=5, eval_docs=7, max_source_length=48),
}
LIBRARY = {"pseudolabel": ("modelshrink.steps.pseudolabel", "pseudolabel"), "distill": ("modelshrink.steps.distill", "distill"),
           "quantize": ("modelshrink.steps.quantize", "quantize"), "contrastive": ("modelshrink.steps.contrastive", "contrastive"),
           "eval": ("modelshrink.steps.evaluate", "evaluate"), "export": ("modelshrink.steps.export", "export_model"),
           "quickstart": ("modelshrink.quickstart", "run_quickstart")}


def _parsed(monkeypatch, args: list[str]):
    """The Options a command line builds, caught where the command hands them to its library function."""
    import importlib

    seen = []

    def fake(options, output, **kwargs):
        seen.append(options)
        if options.STEP == "eval":
            return Path(output), {"task": "summarization", "documents": 0}
        if options.STEP == "quickstart":
            return {"comparison": {"task": "summarization", "systems": [],
                                   "significance": {"method": "permutation", "against": "none"}},
                    "export": {"folder": str(Path(output) / "export"), "check": "passed"}}
        return (Path(output), {}) if options.STEP == "export" else Path(output)

    module, name = LIBRARY[next(a for a in args if a in LIBRARY)]
    monkeypatch.setattr(importlib.import_module(module), name, fake)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_every_step_has_an_example_and_a_generated_command():
    assert set(EXAMPLES) == set(OPTIONS_OF)


@pytest.mark.parametrize("step", sorted(EXAMPLES))
def test_command_parameters_are_the_options_fields(step):
    """Name, default and flag of every field appear on the command, so they cannot drift apart."""
    import typer.main

    command = typer.main.get_command(app).commands[step]
    params = {p.name: p for p in command.params}
    cls = OPTIONS_OF[step]
    for f in dataclasses.fields(cls):
        if step == "eval" and f.name in ("model", "data"):
            assert params["inputs"].nargs == -1  # MODEL DATA | PREDICTIONS
            continue
        assert f.name in params, f"{step}: --{f.name} is not a parameter"
        p = params[f.name]
        if spec_of(f).argument:
            assert p.param_type_name == "argument"
            continue
        assert flag_of(f) in p.opts, (step, f.name, p.opts)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert p.default == default, (step, f.name, p.default, default)
        hint = typing.get_type_hints(cls)[f.name]
        if hint in (bool, int, float, str):
            assert _python_type(p) is hint, (step, f.name, _python_type(p))


def _python_type(param) -> type | None:
    """The Python type a command-line parameter parses to. A recent Typer keeps its annotation (`type_descriptor`)
    and its parameters have no Click `type`; an older one's are Click's, whose `type` says it (a range is a
    subclass of its number's type)."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        return descriptor.annotation
    kinds = ((click.types.BoolParamType, bool), (click.types.IntParamType, int),
             (click.types.FloatParamType, float), (click.types.StringParamType, str))
    return next((python for kind, python in kinds if isinstance(param.type, kind)), None)


@pytest.mark.slow
@pytest.mark.parametrize("step", sorted(EXAMPLES))
def test_manifest_options_replay_as_a_recipe(step, tmp_path, monkeypatch):
    """A manifest's `options`, written as a TOML table, is a recipe giving back the same Options,
    through the step's own --config and through the root's."""
    options = EXAMPLES[step]
    recorded = json.loads(json.dumps(options.recorded()))  # as a manifest stores them
    assert OPTIONS_OF[step].from_recorded(recorded) == options
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(to_toml(step, recorded))
    assert _parsed(monkeypatch, [step, "--config", str(recipe), "-o", str(tmp_path / "out")]) == options
    assert _parsed(monkeypatch, ["--config", str(recipe), step, "-o", str(tmp_path / "out")]) == options
    bare = tmp_path / "bare.toml"  # the options table alone, without [step]
    bare.write_text(to_toml(step, recorded).split("\n", 1)[1])
    assert _parsed(monkeypatch, [step, "--config", str(bare), "-o", str(tmp_path / "out")]) == options


@pytest.mark.parametrize("step", sorted(EXAMPLES))
def test_the_replay_line_names_its_step_and_parses_to_the_same_options(step, tmp_path, monkeypatch):
    line = EXAMPLES[step].replay(tmp_path / "out")
    words = shlex.split(line)
    assert words[:2] == ["modelshrink", step]
    assert _parsed(monkeypatch, words[1:]) == EXAMPLES[step]


def test_recipe_keys_and_values_are_checked(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[distill]\ndata = 'x.jsonl'\nteacher = 't'\nno_such = 1\n")
    result = runner.invoke(app, ["distill", "--config", str(recipe), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "has no option 'no_such'" in result.output
    recipe.write_text("[distill]\ndata = 'x.jsonl'\nteacher = 't'\nlr = nan\nmax_steps = 1\n")
    result = runner.invoke(app, ["distill", "--config", str(recipe), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "--lr must be a finite number" in result.output
    # a value of the wrong type names the file and the key, not only the flag
    for line, expected in (("max_steps = 'ten'", "max_steps = 'ten': expected a whole number"),
                           ("lr = true", "lr = True: expected a number"),
                           ("save_every = 1.5", "save_every = 1.5: expected a whole number"),
                           ("decoder_layer_ids = ['a']", "expected a whole number")):
        recipe.write_text(f"[distill]\ndata = 'x.jsonl'\nteacher = 't'\n{line}\n")
        result = runner.invoke(app, ["distill", "--config", str(recipe), "-o", str(tmp_path / "o")])
        assert result.exit_code == 1, result.output
        assert f"config {recipe}: [distill] " in result.output and expected in result.output, result.output
    recipe.write_text("[distill]\ndata = 'x.jsonl'\nteacher = 't'\nlr = 1\ndecoder_layer_ids = [0, 5]\n"
                      "max_steps = 0\n")  # an int where a float goes, a list of ints: accepted
    result = runner.invoke(app, ["distill", "--config", str(recipe), "-o", str(tmp_path / "o")])
    assert "expected" not in result.output


# ---------------------------------------------------------------- real runs of the training steps

@pytest.fixture(scope="module")
def runs(tmp_path_factory, saved_models):
    """Tiny real runs of every training step with validation: their artifacts and commands."""
    root = tmp_path_factory.mktemp("contracts")
    pairs = write_jsonl(root / "pairs.jsonl", [{"id": i, "document": d, "summary": s}
                                               for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))])
    sentences = write_jsonl(root / "sentences.jsonl", [{"id": i, "sentence": d, "label": i % 2}
                                                       for i, d in enumerate(DOCUMENTS * 2)])
    classifier = save_classifier(root / "classifier", bert_tokenizer(), layers=2)
    common = ["--max-steps", "2", "--batch-size", "4", "--device", "cpu", "--save-every", "1"]
    commands = {
        "distill": ["distill", str(pairs), "--teacher", str(saved_models["bart"]), "--decoder-layers", "1",
                    "--validation", str(pairs), "--eval-limit", "4", "--max-length", "8", "--eval-every", "1",
                    *common],
        "quantize": ["quantize", str(saved_models["bart"]), "--bits", "8-8-8", "--data", str(pairs),
                     "--validation", str(pairs), "--eval-limit", "4", "--max-length", "8", *common],
        "quantize-classifier": ["quantize", str(classifier), "--bits", "8-8-8", "--data", str(sentences),
                                "--validation", str(sentences), *common],
        "contrastive": ["contrastive", str(sentences), "--teacher", str(classifier), "--layers", "1",
                        "--feature-map", "copied", "--validation", str(sentences), *common],
    }
    out = {}
    for name, args in commands.items():
        folder = root / name
        result = runner.invoke(app, [*args, "-o", str(folder)])
        assert result.exit_code == 0, (name, result.output)
        out[name] = (folder, args)
    return out


@pytest.mark.slow
def test_validation_json_has_one_schema(runs):
    for name, (folder, _) in runs.items():
        validation = json.loads((folder / "validation.json").read_text())
        metric = validation["metric"]
        assert isinstance(validation["step"], int) and metric in validation, (name, validation)
        assert read_manifest(folder)["metrics"]["validation"][metric] == validation[metric], name


@pytest.mark.slow
def test_every_model_card_opens_with_the_hubs_metadata_and_says_what_the_manifest_says(runs, tmp_path):
    """huggingface_hub's ModelCard (offline) parses each card's front matter: library, task, tags and the model the
    step started from, as the manifest records them; an export's card says onnxruntime and the task of its data."""
    from huggingface_hub import ModelCard

    tasks = {"distill": "summarization", "quantize": "summarization", "quantize-classifier": "text-classification",
             "contrastive": "text-classification"}
    for name, (folder, args) in runs.items():
        data = ModelCard.load(folder / "README.md").data.to_dict()
        manifest = read_manifest(folder)
        base = manifest["options"].get("teacher") or manifest["options"].get("model")
        assert data["library_name"] == "transformers" and data["pipeline_tag"] == tasks[name], (name, data)
        assert data["base_model"] == base and "modelshrink" in data["tags"], (name, data)
        assert {"distill": "distillation", "quantize": "quantization", "contrastive": "ackd"}[args[0]] in data["tags"]
        assert "datasets" not in data  # local files are no hub datasets
        assert (folder / "README.md").read_text().count("\n---\n") == 1  # one front matter, then the card
    folder, _ = runs["distill"]
    result = runner.invoke(app, ["export", str(folder), "-o", str(tmp_path / "onnx"), "--no-validate"])
    assert result.exit_code == 0, result.output
    data = ModelCard.load(tmp_path / "onnx" / "README.md").data.to_dict()
    assert (data["library_name"], data["pipeline_tag"], data["base_model"]) == ("onnxruntime", "summarization",
                                                                               str(folder))
    assert {"modelshrink", "onnx"} <= set(data["tags"])


@pytest.mark.slow
def test_eval_puts_its_scores_in_the_scored_models_model_index(runs, tmp_path):
    """After `eval`, the model's card has a model-index with eval's own numbers, task and data (ModelCard reads it
    back); the manifest, which pins every file but the card, is untouched and still verifies."""
    from huggingface_hub import ModelCard

    from modelshrink.artifacts import verify_files
    from modelshrink.cards import RESULT_METRICS

    for name, task in (("distill", "summarization"), ("contrastive", "text-classification")):
        folder, _ = runs[name]
        manifest = read_manifest(folder)
        data = manifest["options"]["validation"]
        for limit in ("4", "3"):  # the same data scored again replaces its entry
            out = tmp_path / f"eval-{name}-{limit}"
            result = runner.invoke(app, ["eval", str(folder), data, "-o", str(out), "--limit", limit,
                                         "--latency-docs", "0", "--resamples", "100"])
            assert result.exit_code == 0, result.output
        metrics = json.loads((out / "metrics.json").read_text())
        card = ModelCard.load(folder / "README.md")
        expected = [(shown, metrics[key]) for key, (_, shown) in RESULT_METRICS.items() if key in metrics]
        assert len(expected) >= 3 and [(r.metric_name, r.metric_value) for r in card.data.eval_results] == expected
        for r in card.data.eval_results:
            assert (r.task_type, r.dataset_type, r.dataset_name) == (task, Path(data).name, f"{Path(data).name} "
                                                                     "(first 3 rows)"), r
        index = card.data.to_dict()["model-index"]
        assert index[0]["name"] == folder.name and card.data.to_dict()["library_name"] == "transformers"
        assert read_manifest(folder) == manifest and verify_files(folder) == []
    # an artifact of an earlier version, whose manifest pins its card, keeps the card as it is
    import shutil

    old = tmp_path / "earlier"
    shutil.copytree(runs["distill"][0], old)
    manifest = read_manifest(old)
    manifest["files"]["README.md"] = sha256_file(old / "README.md")
    (old / "modelshrink.json").write_text(json.dumps(manifest))
    before = (old / "README.md").read_text()
    result = runner.invoke(app, ["eval", str(old), manifest["options"]["validation"], "-o", str(tmp_path / "e-old"),
                                 "--limit", "2", "--latency-docs", "0", "--resamples", "100"])
    assert result.exit_code == 0 and "pins its model card" in result.output, result.output
    assert (old / "README.md").read_text() == before and verify_files(old) == []


@pytest.mark.slow
def test_model_card_reproduce_line_is_its_own_step(runs, monkeypatch):
    for name, (folder, args) in runs.items():
        card = (folder / "README.md").read_text()
        line = card.split("## Reproduce", 1)[1].split("```bash\n", 1)[1].split("\n", 1)[0]
        words = shlex.split(line)
        assert words[:2] == ["modelshrink", args[0]], (name, line)
        manifest = read_manifest(folder)
        options = OPTIONS_OF[args[0]].from_recorded(manifest["options"])
        assert _parsed(monkeypatch, words[1:]) == options, name


@pytest.mark.slow
def test_resuming_a_finished_output_changes_nothing(runs):
    for name, (folder, args) in runs.items():
        before = {p.name: sha256_file(p) for p in folder.iterdir() if p.is_file()}
        result = runner.invoke(app, [*args, "-o", str(folder), "--resume"])
        assert result.exit_code == 0, (name, result.output)
        assert {p.name: sha256_file(p) for p in folder.iterdir() if p.is_file()} == before, name


# ---------------------------------------------------------------- the package's shape

def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__"
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level)[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("modelshrink")}


def _module_graph(top_level_only: bool) -> dict[str, set[str]]:
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return {name: {m for m in _imports(path, top_level_only) if m in modules and m != name}
            for name, path in modules.items()}


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module-level", "with-lazy-imports"])
def test_no_import_cycle_inside_the_package(top_level_only):
    graph = _module_graph(top_level_only)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if node.startswith(nxt + "."):  # a submodule's import runs its package's __init__ first: no cycle
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


# The package's floors, lowest first: a module imports from its own floor or one below, never from above. A root
# module is its own unit, a folder is one; CONTRIBUTING.md's architecture map follows this order.
FLOORS = (
    ("runtime",),                                     # torch-free inference: imports nothing else of the package
    ("_version", "errors", "families", "languages", "precision", "figures", "locks", "metrics"),  # facts, leaves
    ("artifacts", "quant", "options"),                # the artifact contract, what --bits means, every option
    ("data", "cards"),                                # reading inputs, the model cards' front matter
    ("models",),                                      # loading, checking, shrinking and measuring models
    ("generation",),                                  # writing summaries and translations
    ("training",),                                    # the loop, the run, losses, students, classifiers
    ("evaluation",),                                  # predicting, scoring, comparing
    ("onnx",),                                        # the export's graphs
    ("steps",),                                       # one library function a command
    ("quickstart", "commands", "cli", "__main__", "__init__"),  # what a user calls
)


def _unit(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_every_import_goes_to_its_own_floor_or_one_below():
    floor = {unit: i for i, units in enumerate(FLOORS) for unit in units}
    units = {_unit(m) for m in _module_graph(False)}
    assert units == set(floor), ("a root module or folder with no floor, or a floor with no module",
                                 units ^ set(floor))
    upward = sorted(f"{a} imports {b}" for a, targets in _module_graph(False).items() for b in targets
                    if b != "modelshrink" and floor[_unit(b)] > floor[_unit(a)])
    assert not upward, upward


def test_no_module_reads_a_name_from_the_package_facade():
    """`modelshrink/__init__.py` imports the steps, which import nearly everything: a module below it that takes
    a name from it (rather than a submodule, as `from modelshrink import locks`) imports upward."""
    submodules = {p.stem if p.suffix == ".py" else p.name for p in SRC.iterdir() if p.name != "__init__.py"}
    readers = []
    for path in SRC.rglob("*.py"):
        if path.parent == SRC and path.name in ("__init__.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "modelshrink" and not node.level:
                readers += [f"{path.relative_to(SRC)}: {a.name}" for a in node.names if a.name not in submodules]
    assert not readers, readers


def test_library_modules_do_not_import_the_command_line():
    for path in SRC.rglob("*.py"):
        if "commands" in path.parts or path.name in ("cli.py", "__main__.py"):
            continue
        text = path.read_text()
        assert "import typer" not in text and "from rich" not in text and "import rich" not in text, path


def test_runtime_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, modelshrink.runtime; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_options_sit_under_the_modules_that_read_them():
    """Importing every step's options pulls in no torch and none of the modules that read them: only the options
    themselves and torch-free leaves (errors and the runtime's error type, precision names, significance methods,
    metric names, `quant.spec`: what --bits means)."""
    import subprocess
    import sys

    code = ("import pkgutil, importlib, sys, modelshrink.options as o\n"
            "for m in pkgutil.iter_modules(o.__path__): importlib.import_module(f'modelshrink.options.{m.name}')\n"
            "print(' '.join(sorted(n for n in sys.modules if n.startswith('modelshrink'))), 'torch' in sys.modules)")
    names, torch_loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                         text=True).stdout.rsplit(" ", 1)
    leaves = ("modelshrink.options", "modelshrink.runtime", "modelshrink.errors", "modelshrink.precision",
              "modelshrink.metrics", "modelshrink.quant.spec")
    outside = {n for n in names.split() if not n.startswith(leaves)} - {"modelshrink", "modelshrink._version",
                                                                          "modelshrink.quant"}
    assert {"modelshrink.metrics.stats", "modelshrink.metrics.names"} >= {
        n for n in names.split() if n.startswith("modelshrink.metrics.")}
    assert not outside and torch_loaded.strip() == "False", (outside, torch_loaded)


def _names_read(files: list[Path], own: bool) -> set[str]:
    """Attribute names read in `files` (only `self.X` where `own`: an options class's own checks) and the
    string constants there (fields read with getattr, `given`, or sets of names)."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and (
                    not own or (isinstance(node.value, ast.Name) and node.value.id == "self")):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
    return names


def _unread_options(library: set[str], checks: set[str]) -> dict[str, list[str]]:
    return {step: sorted(f.name for f in dataclasses.fields(type(options))
                         if f.name not in library and f.name not in checks)
            for step, options in EXAMPLES.items()}


def test_every_option_is_read_by_the_library_or_refused_by_its_own_checks():
    """The static half of "no option silently does nothing": every field of every step's options (the shared
    training and generation options included) is read by a library module, or by its options' own checks
    (which refuse what a combination would ignore). An option declared and never read fails here."""
    library = _names_read([p for p in SRC.rglob("*.py") if "options" not in p.parts], own=False)
    checks = _names_read(list((SRC / "options").glob("*.py")), own=True)
    assert _unread_options(library, checks) == {step: [] for step in EXAMPLES}
    # and the walk can fail: a field nobody reads is found
    assert _unread_options(library - {"lr"}, checks - {"lr"})["distill"] == ["lr"]


def _other_value(f: dataclasses.Field, hint: Any) -> Any:
    """A value of field `f` other than its default, inside its declared range and choices."""
    spec = spec_of(f)
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    inner = typing.get_args(hint)[0] if type(None) in typing.get_args(hint) else hint
    if spec.choices is not None:
        return next(c for c in spec.choices if c != default)
    if f.name == "report_to":
        return "tensorboard"
    if inner is bool:
        return not default if default is not None else True
    if typing.get_origin(inner) is list:
        return [0, 1]
    if typing.get_origin(inner) is tuple:
        return (1.0, 1.5)
    if inner in (int, float):
        low = spec.min if spec.min is not None else (spec.above if spec.above is not None else 0)
        high = spec.max if spec.max is not None else (spec.below if spec.below is not None else None)
        start = default if default is not None else low
        for value in (start + 1, (start + high) / 2 if high is not None else None, (low + start) / 2):
            if value is None or (inner is int and value != int(value)):
                continue
            if value != default and value > low and (high is None or value < high):
                return inner(value)
        raise AssertionError(f"no other value for {f.name}")
    return "x.jsonl"


# the fields each step needs to run at all (positional arguments, a training budget)
_BASES = {"pseudolabel": dict(teacher="t", data="d.jsonl"), "distill": dict(data="d.jsonl", teacher="t", max_steps=1),
          "quantize": dict(model="m", data="d.jsonl", max_steps=1),
          "contrastive": dict(data="d.jsonl", teacher="t", layers=1, max_steps=1), "eval": dict(model="m", data="d.jsonl"),
          "export": dict(model="m"), "quickstart": dict()}


@pytest.mark.slow
@pytest.mark.parametrize("step", sorted(EXAMPLES))
def test_every_option_away_from_its_default_is_recorded_and_replayed_or_refused_in_one_line(step, tmp_path,
                                                                                            monkeypatch):
    """The dynamic half of "no option silently does nothing", option by option: each field set alone to another
    value (in its range and choices) is either refused in one line, or recorded (the manifest's options and
    recipe differ from the default run's) and given back by the Reproduce line through the command line. The
    static test above shows the library reads every one."""
    cls = OPTIONS_OF[step]
    hints = typing.get_type_hints(cls)
    base = cls(**_BASES[step])
    refused, kept = [], []
    for f in dataclasses.fields(cls):
        if spec_of(f).argument or f.name in _BASES[step]:
            continue
        value = _other_value(f, hints[f.name])
        try:
            options = cls(**{**_BASES[step], f.name: value})
        except UserError as e:
            assert "\n" not in str(e) and str(e), (step, f.name, str(e))
            refused.append(f.name)
            continue
        assert options.recorded() != base.recorded() and options.recorded()[key_of(f)] is not None, (step, f.name)
        words = shlex.split(options.replay(tmp_path / "out"))
        assert flag_of(f) in words or f"--no-{flag_of(f)[2:]}" in words, (step, f.name, words)
        assert _parsed(monkeypatch, words[1:]) == options, (step, f.name)
        kept.append(f.name)
    assert kept, step  # the walk reached the step's options
    # a combination an option needs is refused rather than ignored, e.g. --eval-every without --validation
    if step in ("distill", "quantize", "contrastive"):
        assert {"eval_every", "early_stopping", "tracking_dir"} <= set(refused) and "report_to" in kept, refused


@pytest.mark.parametrize("step", sorted(_BASES))
def test_every_option_that_goes_with_another_is_refused_alone_in_one_line(step):
    """Each options class's GOES_WITH table, walked: the option away from its default, the one it goes with at its
    default, is refused naming both (and the same option with its partner given is not refused for that)."""
    from modelshrink.commands._from_options import OPTIONS_OF
    import modelshrink.cli  # noqa: F401  (registers every step's options class)

    cls = OPTIONS_OF[step]
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    table = cls.goes_with()
    if step in ("distill", "quantize", "contrastive", "export", "pseudolabel"):
        assert table, f"{step} has options that go with others"
    for name, needed in table.items():
        given = {**_BASES[step], name: _other_value(fields[name], hints[name])}
        if given.get(needed) is not None and needed in _BASES[step]:
            given.pop(needed)
        with pytest.raises(UserError) as caught:
            cls(**given)
        message = str(caught.value)
        assert message.startswith(f"{flag_of(fields[name])} goes with {flag_of(fields[needed])}"), message
        partner = {**given, needed: _other_value(fields[needed], hints[needed])}
        try:
            cls(**partner)
        except UserError as e:  # another rule may refuse the pair; not this one
            assert not str(e).startswith(f"{flag_of(fields[name])} goes with"), str(e)


def test_the_family_table_is_the_one_list_of_seq2seq_model_types():
    """Issue 79: which model types are BART-like, T5-like or bert2bert, and which normalise first, is said once, in
    modelshrink.families; the static search and the LM head read it there. transformers.js's own list of what it
    loads (onnx/layout.py) is that library's knowledge, not ours."""
    from modelshrink.families import FAMILIES, PRE_NORM_TYPES, SEQ2SEQ_TYPES
    from modelshrink.generation.static import decoders
    from modelshrink.models import lm_head

    assert set(SEQ2SEQ_TYPES) == {t for f in FAMILIES for t in f.model_types} and set(PRE_NORM_TYPES) <= set(SEQ2SEQ_TYPES)
    assert decoders.SEQ2SEQ_TYPES is SEQ2SEQ_TYPES and lm_head.SEQ2SEQ_TYPES is SEQ2SEQ_TYPES
    named = re.compile(r"""["'](%s)["']""" % "|".join(t for t in SEQ2SEQ_TYPES if t not in ("bart", "t5")))
    elsewhere = [f"{path.relative_to(SRC)}:{n}" for path in sorted(SRC.rglob("*.py")) if path.name != "families.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if named.search(line) and "TRANSFORMERS_JS" not in line]
    assert not elsewhere, elsewhere
