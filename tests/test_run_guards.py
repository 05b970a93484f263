"""What guards a run's output: one run per output (the staging lock), outputs that cannot be
written refused before the model loads, a full disk as one line, Ctrl-C (130, the folder kept, the
command that continues it), row indices checked at assembly, and progress on a non-terminal."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS, SUMMARIES, write_jsonl
from modelshrink import locks
from modelshrink.generation import shards
from modelshrink.artifacts import ArtifactWriter, staging_path
from modelshrink.cli import app
from modelshrink.errors import UserError

runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def invoke(*args, **kw):
    return runner.invoke(app, [str(a) for a in args], **kw)


def one_line_error(result, *fragments, mid_run: bool = False) -> str:
    """Exit 1 with one `Error:` line, the only stderr line (after a step's informational lines, `mid_run`)."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    assert errors == [lines[-1]] and (mid_run or len(lines) == 1), result.stderr
    lines = lines[-1:]
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def sleeper():
    """A live process that is not us: its pid stands for another run's."""
    process = subprocess.Popen(["sleep", "60"])
    yield process.pid
    process.kill()
    process.wait()


def write_lock(staging: Path, pid: int, host: str | None = None, age: float = 0.0) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    path = staging / locks.LOCK_NAME
    path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "started": "then"}))
    if age:
        os.utime(path, (time.time() - age, time.time() - age))


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


# --- the lock --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_live_run_blocks_resume_overwrite_and_a_plain_rerun(saved_models, docs_jsonl, tmp_path, sleeper):
    out = tmp_path / "pl"
    write_lock(staging_path(out), sleeper)
    for extra in ([], ["--resume"], ["--overwrite"]):
        result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", out, *extra)
        one_line_error(result, f"another run (pid {sleeper} on {socket.gethostname()}", f"is writing {out}")
    assert (staging_path(out) / locks.LOCK_NAME).is_file()  # the live run's folder is untouched


@pytest.mark.parametrize("step", ["distill", "quantize", "quantize-direct", "contrastive", "eval", "export"])
def test_every_step_refuses_an_output_a_live_run_is_writing(step, saved_models, classifier_path, docs_jsonl,
                                                            tmp_path, sleeper):
    sentences = write_jsonl(tmp_path / "sst.jsonl", [{"sentence": d, "label": i % 2} for i, d in enumerate(DOCUMENTS)])
    out = tmp_path / "out"
    args = {"distill": ["distill", docs_jsonl, "--teacher", saved_models["bart"], "--decoder-layers", "1", "--max-steps", "1"],
            "quantize": ["quantize", saved_models["bart"], "--data", docs_jsonl, "--max-steps", "1"],
            "quantize-direct": ["quantize", saved_models["bart"], "--method", "direct"],
            "contrastive": ["contrastive", sentences, "--teacher", classifier_path, "--layers", "1", "--max-steps", "1"],
            "eval": ["eval", saved_models["bart"], docs_jsonl],
            "export": ["export", saved_models["bart"]]}[step]
    write_lock(staging_path(out), sleeper)
    for extra in ([], ["--overwrite"]):
        one_line_error(invoke(*args, "-o", out, *extra), f"another run (pid {sleeper} on")


def test_a_dead_runs_lock_does_not_block(saved_models, docs_jsonl, tmp_path):
    out = tmp_path / "pl"
    write_lock(staging_path(out), dead_pid())
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", out, "--resume", "--limit", "2")
    assert result.exit_code == 0, result.stderr
    assert not staging_path(out).exists() and not (out / locks.LOCK_NAME).exists()
    assert locks.LOCK_NAME not in json.loads((out / "modelshrink.json").read_text())["files"]


def test_another_hosts_lock_blocks_while_fresh_and_not_once_stale(tmp_path):
    staging = tmp_path / ".out.partial"
    write_lock(staging, 1, host="elsewhere")
    assert locks.holder(staging)["host"] == "elsewhere"
    write_lock(staging, 1, host="elsewhere", age=locks.STALE_SECONDS + 5)
    assert locks.holder(staging) is None


def test_the_holders_own_process_takes_its_lock_again_and_a_torn_lock_is_stale(tmp_path):
    staging = tmp_path / ".out.partial"
    write_lock(staging, os.getpid())
    assert locks.holder(staging) is None
    (staging / locks.LOCK_NAME).write_text('{"pid": 12')
    assert locks.holder(staging) is None


def test_a_second_writer_opening_a_fresh_output_is_refused(tmp_path, sleeper):
    out = tmp_path / "out"
    first = ArtifactWriter(out, resume=True, keep_on_failure=True)
    first.check()
    second = ArtifactWriter(out, resume=True, keep_on_failure=True)
    second.check()  # both looked before either started
    first.open()
    # the lock is the first one's; as seen from a second process:
    record = json.loads((first.staging / locks.LOCK_NAME).read_text())
    (first.staging / locks.LOCK_NAME).write_text(json.dumps({**record, "pid": sleeper}))
    with pytest.raises(UserError, match="another run"):
        second.open()


def test_the_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "HEARTBEAT_SECONDS", 0.05)
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    locks.acquire(staging, tmp_path / "out")
    old = time.time() - 1000
    os.utime(staging / locks.LOCK_NAME, (old, old))
    time.sleep(0.3)
    assert (staging / locks.LOCK_NAME).stat().st_mtime > old + 900
    locks.release(staging)
    assert not (staging / locks.LOCK_NAME).exists()


# --- assembly --------------------------------------------------------------------------------------

def _part(staging: Path, rank: int, world: int, indices: list) -> None:
    path = shards.part_path(staging, rank, world)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"_index": i, "summary": f"s{i}"}) + "\n" for i in indices))


@pytest.mark.parametrize("parts, message", [
    ([[0, 2], [1, 2]], "row 2 is in"),  # the same row in two parts
    ([[0, 0, 2], [1]], "row 0 is written twice"),  # twice in one part
    ([[0, 2], [1, 7]], "index 7, outside 0..2"),  # not a row of this input
])
def test_assembly_checks_every_rows_index(tmp_path, parts, message):
    for rank, indices in enumerate(parts):
        _part(tmp_path, rank, 2, indices)
    with pytest.raises(UserError, match=message):
        list(shards.merged_rows(tmp_path, 2, 3))


def test_assembly_in_order(tmp_path):
    _part(tmp_path, 0, 2, [0, 2])
    _part(tmp_path, 1, 2, [1])
    assert [r["summary"] for r in shards.merged_rows(tmp_path, 2, 3)] == ["s0", "s1", "s2"]


# --- outputs that cannot be written ------------------------------------------------------------------

def _fail_if_loaded(monkeypatch):
    def loaded(*a, **k):
        raise AssertionError("the model was loaded before the output was checked")
    monkeypatch.setattr("modelshrink.generation.summarizer.load_seq2seq", loaded)  # the model pseudolabel loads


def test_an_output_under_a_file_is_refused_before_loading(saved_models, docs_jsonl, tmp_path, monkeypatch):
    _fail_if_loaded(monkeypatch)
    (tmp_path / "afile").write_text("x")
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", tmp_path / "afile" / "out")
    one_line_error(result, "its parent", "is a file")


def test_a_read_only_place_is_refused_before_loading(saved_models, docs_jsonl, tmp_path, monkeypatch):
    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")
    _fail_if_loaded(monkeypatch)
    monkeypatch.setattr("modelshrink.artifacts.tempfile.mkstemp", read_only)
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", tmp_path / "out")
    one_line_error(result, "cannot be written: Read-only file system")
    assert not (tmp_path / "out").exists() and not staging_path(tmp_path / "out").exists()


@pytest.mark.skipif(os.access("/sys", os.W_OK) and not os.path.ismount("/sys"), reason="needs a read-only /sys")
def test_a_real_read_only_filesystem_is_refused(saved_models, docs_jsonl, tmp_path):
    probe = subprocess.run(["touch", "/sys/modelshrink-probe"], capture_output=True)
    if probe.returncode == 0:
        os.unlink("/sys/modelshrink-probe")
        pytest.skip("/sys is writable here")
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", "/sys/modelshrink-out")
    one_line_error(result, "output /sys/modelshrink-out cannot be written")


def test_a_full_filesystem_is_refused_before_loading(saved_models, docs_jsonl, tmp_path, monkeypatch):
    import shutil

    _fail_if_loaded(monkeypatch)
    monkeypatch.setattr("modelshrink.artifacts.shutil.disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 0))
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", tmp_path / "out")
    one_line_error(result, "only 0 bytes are free")


def test_no_space_left_mid_run_is_one_line_and_keeps_the_run(saved_models, docs_jsonl, tmp_path, monkeypatch):
    real = shards.run_part

    def full(batches, launch, staging, run, total, progress=None):
        real(list(batches)[:1], launch, staging, run, total)  # one batch made it to disk
        raise OSError(errno.ENOSPC, "No space left on device", str(shards.part_path(staging, 0, 1)))

    monkeypatch.setattr(shards, "run_part", full)
    out = tmp_path / "out"
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", out, "--batch-size", "2", "--quiet")
    line = one_line_error(result, "No space left on device writing", "part-00000-of-00001.jsonl",
                          f"The unfinished run is kept in {staging_path(out)}", "keeping the rows already written")
    assert line.endswith("--resume")  # (the command itself is sys.argv's, pytest's here; see the Ctrl-C test)
    monkeypatch.setattr(shards, "run_part", real)
    resumed = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", out, "--batch-size", "2", "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    manifest = json.loads((out / "modelshrink.json").read_text())
    assert manifest["metrics"]["generated_this_run"] == len(DOCUMENTS) - 2


def test_a_full_disk_inside_a_library_is_one_line_too(saved_models, docs_jsonl, tmp_path, monkeypatch):
    def full(*a, **k):  # how safetensors reports it
        raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                           'message: "No space left on device" })')

    monkeypatch.setattr("modelshrink.steps.quantize.save_quantized", full)
    result = invoke("quantize", saved_models["bart"], "-o", tmp_path / "q", "--method", "direct", "--bits", "8-8-8")
    one_line_error(result, "No space left on device", "Nothing was written.", mid_run=True)
    assert not staging_path(tmp_path / "q").exists()


# --- Ctrl-C -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stopped(saved_models, tmp_path_factory):
    """A pseudolabel run in a process of its own for each of Ctrl-C (SIGINT) and SIGTERM, both started at once (each is
    mostly one core importing torch) and each sent its signal as soon as its first row is on disk. Returns signal ->
    (pseudolabel's arguments, its output, whether it was still running when signalled, exit code, stderr)."""
    root = tmp_path_factory.mktemp("stopped")
    rows = [{"id": f"d{i}", "document": DOCUMENTS[i % 12], "summary": SUMMARIES[i % 12]} for i in range(8)]
    data = write_jsonl(root / "many.jsonl", rows)
    runs = {}
    for stop in (signal.SIGINT, signal.SIGTERM):
        (root / stop.name).mkdir()
        out = root / stop.name / "pl"
        args = ["pseudolabel", str(saved_models["bart"]), str(data), "-o", str(out), "--batch-size", "1",
                "--min-length", "30", "--max-length", "30", "--device", "cpu"]
        # a shell without job control starts background commands with SIGINT ignored, and Python then keeps
        # it ignored (as a CLI should): the child gets the default, as a terminal's Ctrl-C finds it
        process = subprocess.Popen([sys.executable, "-m", "modelshrink", *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=ENV,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        runs[stop] = args, out, process
    running, deadline = {}, time.time() + 120
    while len(running) < len(runs) and time.time() < deadline:
        for stop, (_, out, process) in runs.items():
            part = shards.part_path(staging_path(out), 0, 1)
            if stop not in running and part.exists() and part.stat().st_size:
                running[stop] = process.poll() is None
                process.send_signal(stop)
        time.sleep(0.02)
    stopped = {}
    for stop, (args, out, process) in runs.items():
        if stop not in running:  # no row in time: stopped all the same, and the test says so
            running[stop] = False
            process.kill()
        _, stderr = process.communicate(timeout=60)
        stopped[stop] = args, out, running[stop], process.returncode, stderr
    return stopped


@pytest.mark.slow
@pytest.mark.parametrize("stop, code, said", [(signal.SIGINT, 130, "Interrupted."),
                                              (signal.SIGTERM, 143, "Terminated (SIGTERM).")])
def test_ctrl_c_keeps_the_run_and_prints_the_command_that_continues_it(stopped, stop, code, said):
    args, out, running, returncode, stderr = stopped[stop]
    assert running, "the run finished (or wrote no row) before it could be interrupted\n" + stderr[-3000:]
    assert returncode == code, stderr
    assert not out.exists() and staging_path(out).is_dir()
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"{said} The unfinished run is kept in {staging_path(out)}; continue it keeping "
                           "the rows already written with: modelshrink pseudolabel"), last
    command = shlex.split(last.split(" with: ", 1)[1])
    assert command == ["modelshrink", *args, "--resume"]
    if stop == signal.SIGTERM:
        return  # the same resume as after Ctrl-C
    # the printed command continues the run; in this process (only the interrupted run needs a process of its own)
    resumed = invoke(*command[1:])
    assert resumed.exit_code == 0, resumed.stderr
    assert len((out / "data.jsonl").read_text().splitlines()) == 8


def test_ctrl_c_in_a_step_without_resume_says_nothing_was_written(saved_models, tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("modelshrink.steps.quantize.save_quantized", interrupted)
    result = invoke("quantize", saved_models["bart"], "-o", tmp_path / "q", "--method", "direct")
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines()[-1] == "Interrupted. Nothing was written."
    assert not staging_path(tmp_path / "q").exists()


def test_a_leftover_folder_of_a_step_without_resume_gets_an_honest_hint(saved_models, tmp_path):
    staging_path(tmp_path / "onnx").mkdir()
    result = invoke("export", saved_models["bart"], "-o", tmp_path / "onnx")
    line = one_line_error(result, "an unfinished earlier run left", "pass --overwrite to start over")
    assert "--resume" not in line


# --- progress on a non-terminal -------------------------------------------------------------------

def test_progress_is_plain_lines_off_a_terminal_and_quiet_prints_none(saved_models, docs_jsonl, tmp_path):
    env = {"MODELSHRINK_PROGRESS_SECONDS": "0"}
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", tmp_path / "a", "--batch-size", "4",
                    env=env)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    n = len(DOCUMENTS)
    assert lines[0] == f"pseudolabel: 0/{n} docs (0%)"
    assert lines[-1].startswith(f"pseudolabel: {n}/{n} docs (100%), ") and lines[-1].endswith(", done")
    assert any(" docs/s, elapsed " in line and ", ETA " in line for line in lines[1:-1]), lines
    assert not any("━" in line or "\x1b" in line for line in lines)
    quiet = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", tmp_path / "b", "--quiet", env=env)
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_training_progress_lines(saved_models, docs_jsonl, tmp_path):
    result = invoke("distill", docs_jsonl, "-o", tmp_path / "s", "--teacher", saved_models["bart"],
                    "--decoder-layers", "1", "--max-steps", "3", "--batch-size", "4", "--log-every", "1",
                    env={"MODELSHRINK_PROGRESS_SECONDS": "0"})
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("distill: ")]
    assert lines[0].startswith("distill: 1/3 steps (33%), loss ") and lines[0].endswith(" tok/s"), lines
    assert lines[-1].startswith("distill: 3/3 steps (100%), loss ") and " steps/s, elapsed " in lines[-1], lines
    assert lines[-1].endswith(", done")


def test_resume_of_a_complete_artifact_with_other_options_is_refused(saved_models, docs_jsonl, tmp_path):
    """--resume keeps a complete artifact as it is; asked with options that would make another one
    (λ 2 labels over λ 1 labels, bf16 over fp32 training), it refuses and names them, writing nothing."""
    labels = tmp_path / "labels"
    base = ("pseudolabel", saved_models["bart"], docs_jsonl, "-o", labels, "--limit", "2", "--max-length", "4")
    assert invoke(*base, "--lambda", "1").exit_code == 0
    manifest = (labels / "modelshrink.json").read_bytes()
    line = one_line_error(invoke(*base, "--lambda", "2.0", "--resume"), "--lambda 1.0 (now 2.0)", "--overwrite")
    assert "complete" in line and (labels / "modelshrink.json").read_bytes() == manifest
    again = invoke(*base, "--lambda", "1", "--resume", "--device", "cpu")  # where it runs makes no other labels
    assert again.exit_code == 0 and "already complete" in again.stderr, again.stderr

    student = tmp_path / "student"
    train = ("distill", labels, "-o", student, "--teacher", saved_models["bart"], "--decoder-layers", "1",
             "--max-steps", "1", "--batch-size", "2")
    assert invoke(*train).exit_code == 0
    one_line_error(invoke(*train, "--resume", "--precision", "bf16"), "--precision 'fp32' (now 'bf16')")
    one_line_error(invoke(*train[:-4], "--max-steps", "2", "--batch-size", "2", "--resume"), "--max-steps 1 (now 2)")
    assert "already complete" in invoke(*train, "--resume", "--save-every", "5").stderr


def test_resume_of_a_complete_artifact_warns_when_a_parent_was_made_again(tmp_path):
    """--resume keeps a complete artifact as it is, but says so when an artifact it was made from has been
    remade since (a rerun of a pipeline after a parent was redone would otherwise keep a stale child)."""
    from modelshrink.artifacts import sha256_file
    from modelshrink.training.runs import finished

    parent, child, data = tmp_path / "labels", tmp_path / "student", tmp_path / "train.jsonl"
    parent.mkdir()
    child.mkdir()
    (parent / "modelshrink.json").write_text('{"step": "pseudolabel"}')
    data.write_text("{}\n")
    parents = [{"role": "data", "path": str(parent), "manifest_sha256": sha256_file(parent / "modelshrink.json")},
               {"role": "extra", "path": str(data), "sha256": "0" * 64}]  # data files are not hashed again
    (child / "modelshrink.json").write_text(json.dumps({"step": "distill", "parents": parents}))

    said = []
    assert finished(child, overwrite=False, resume=True, log=said.append)
    assert said == [f"{child} is already complete; nothing to resume"]

    (parent / "modelshrink.json").write_text('{"step": "pseudolabel", "again": true}')
    said.clear()
    assert finished(child, overwrite=False, resume=True, log=said.append)
    assert len(said) == 2 and said[1].startswith(f"warning: {child} was made from an earlier {parent} (data)")
    assert "--overwrite" in said[1]
    assert not finished(child, overwrite=True, resume=True, log=said.append)


def test_options_the_run_would_ignore_are_refused(saved_models, docs_jsonl, tmp_path):
    """An option that the given combination never reads is refused in one line naming it, nothing written:
    validation settings without --validation, and anything but the bits and the model under --method direct."""
    model = saved_models["bart"]
    for extra, named in ((["--num-beams", "2"], "--num-beams goes with --method distill"),
                         (["--max-target-length", "16", "--lr", "1e-3"], "--lr, --max-target-length go with")):
        out = tmp_path / "direct"
        one_line_error(invoke("quantize", model, "-o", out, "--method", "direct", *extra), named, "--method direct")
        assert not out.exists()
    out = tmp_path / "student"
    train = ("distill", docs_jsonl, "-o", out, "--teacher", model, "--decoder-layers", "1", "--max-steps", "1")
    one_line_error(invoke(*train, "--eval-every", "2", "--metric", "rougeL"), "--eval-every, --metric go with "
                   "--validation", "add --validation DATA")
    one_line_error(invoke(*train, "--early-stopping", "2"), "--early-stopping goes with --validation")
    assert not out.exists()


def test_a_model_in_an_unfinished_run_is_refused(saved_models, docs_jsonl, tmp_path):
    """A staging folder is refused as any input: as data already, and as a model (--teacher, MODEL)."""
    import shutil

    staged = tmp_path / ".teacher.partial"
    shutil.copytree(saved_models["bart"], staged)
    one_line_error(invoke("pseudolabel", staged, docs_jsonl, "-o", tmp_path / "labels"), "belongs to an unfinished run",
                   "--resume")
    one_line_error(invoke("distill", docs_jsonl, "-o", tmp_path / "s", "--teacher", staged, "--decoder-layers", "1",
                          "--max-steps", "1"), "teacher", "belongs to an unfinished run")
    assert not (tmp_path / "labels").exists() and not (tmp_path / "s").exists()
