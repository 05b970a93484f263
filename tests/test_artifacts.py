"""The artifact contract: manifest fields, hashes, atomic write, refusing existing outputs."""

from __future__ import annotations

import json

import pytest

from modelshrink import __version__
from modelshrink.artifacts import ArtifactWriter, parent_ref, read_manifest, sha256_file, staging_path, verify_files
from modelshrink.errors import UserError


def _write(out, **kw):
    with ArtifactWriter(out, **kw) as writer:
        (writer.staging / "data.jsonl").write_text('{"a": 1}\n')
        (writer.staging / "sub").mkdir()
        (writer.staging / "sub" / "x.txt").write_text("x")
        return writer.commit(step="test", kind="dataset", options={"k": 1}, parents=[], metrics={"m": 2.0},
                             resolved={"r": 3})


def test_manifest_fields_and_hashes(tmp_path):
    out = _write(tmp_path / "art")
    m = read_manifest(out)
    assert m["schema_version"] == 1 and m["step"] == "test" and m["kind"] == "dataset"
    assert m["modelshrink_version"] == __version__ and m["created"].endswith("+00:00")
    assert m["options"] == {"k": 1} and m["metrics"] == {"m": 2.0} and m["resolved"] == {"r": 3}
    assert m["files"] == {"data.jsonl": sha256_file(out / "data.jsonl"), "sub/x.txt": sha256_file(out / "sub/x.txt")}
    assert {"python", "torch", "transformers"} <= set(m["environment"])
    assert verify_files(out) == []
    (out / "data.jsonl").write_text("changed\n")
    assert verify_files(out) == ["data.jsonl"]


def test_parent_refs(tmp_path):
    out = _write(tmp_path / "art")
    assert parent_ref("data", out)["manifest_sha256"] == sha256_file(out / "modelshrink.json")
    f = tmp_path / "f.jsonl"
    f.write_text("{}\n")
    assert parent_ref("data", f)["sha256"] == sha256_file(f)
    assert parent_ref("teacher", "org/name") == {"role": "teacher", "hub": "org/name"}


def test_failure_leaves_nothing(tmp_path):
    out = tmp_path / "art"
    with pytest.raises(RuntimeError):
        with ArtifactWriter(out) as writer:
            (writer.staging / "data.jsonl").write_text("{}\n")
            raise RuntimeError("boom")
    assert not out.exists() and not staging_path(out).exists()


def test_refusals_and_overwrite(tmp_path):
    out = _write(tmp_path / "art")
    with pytest.raises(UserError, match="already exists"):
        _write(out)
    _write(out, overwrite=True)
    assert json.loads((out / "modelshrink.json").read_text())["step"] == "test"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # no .old or .partial left behind
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        _write(tmp_path / "file")
    with pytest.raises(UserError, match="parent folder"):
        _write(tmp_path / "missing" / "art")
    (tmp_path / "empty").mkdir()
    assert _write(tmp_path / "empty").is_dir()  # an empty folder is fine
