"""The artifact contract shared by every step.

Every step reads artifact folders and writes one. A model artifact is a `save_pretrained` folder
that plain `transformers` loads; a dataset artifact is `data.jsonl`; both carry `modelshrink.json`:

    schema_version, step, kind, modelshrink_version, created, options (the command's options, valid
    as a `--config` recipe section, enough to replay the run), resolved (what the options resolved
    to: defaults taken from the model, detected columns), parents (path + sha256 of their manifest,
    or of the file), files (sha256 of every file), metrics, environment (library versions)

An artifact is written into a hidden sibling folder (`.NAME.partial`) and renamed into place only
when complete, so an interrupted or failed run never leaves a folder that looks finished.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

from modelshrink._version import __version__
from modelshrink import locks
from modelshrink.errors import UserError

SCHEMA_VERSION = 1
MANIFEST_NAME = "modelshrink.json"
CARD_NAME = "README.md"  # the model card: not pinned by the manifest, eval adds its results to it


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(path: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of an artifact folder, or None when `path` is not an artifact."""
    manifest = Path(path) / MANIFEST_NAME
    if not manifest.is_file():
        return None
    try:
        return json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{manifest} is not a readable modelshrink manifest: {e}") from None


def parent_ref(role: str, spec: str | os.PathLike) -> dict[str, Any]:
    """How a manifest names an input: its path and the hash that pins its content."""
    path = Path(spec)
    ref: dict[str, Any] = {"role": role}
    if path.is_dir() and (path / MANIFEST_NAME).is_file():
        ref.update(path=str(path.resolve()), manifest_sha256=sha256_file(path / MANIFEST_NAME))
    elif path.is_file():
        ref.update(path=str(path.resolve()), sha256=sha256_file(path))
    elif path.is_dir():
        ref.update(path=str(path.resolve()))
    else:
        ref.update(hub=str(spec))
    return ref


def staging_path(output: Path) -> Path:
    return output.parent / f".{output.name}.partial"


def check_output(output: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse, before any slow work, an output that is a file, a non-empty folder without
    `overwrite`, or one that cannot be written: a missing parent, a parent that is a file, a
    read-only place, a full filesystem."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise UserError(f"output {output} is a file; expected a folder path (new or empty)")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise UserError(f"output {output} already exists and is not empty; pass --overwrite to replace it")
    parent = output.parent
    if parent.exists() and not parent.is_dir():
        raise UserError(f"output {output} cannot be written: its parent {parent} is a file")
    if not parent.exists():
        raise UserError(f"the parent folder of output {output} does not exist")
    check_writable(parent, output)
    return output


MIN_FREE_BYTES = 1 << 20


def check_writable(folder: Path, output: Path) -> None:
    """Create and remove a small file in `folder`; refuse a filesystem with less than 1 MiB free."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".modelshrink-probe-")
        try:
            os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise UserError(f"output {output} cannot be written: {e.strerror or e} ({folder})") from None
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"output {output} cannot be written: only {free} bytes are free on its filesystem")


def _environment() -> dict[str, str]:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def write_manifest(
    folder: Path,
    *,
    step: str,
    kind: str,
    options: dict[str, Any],
    parents: list[dict[str, Any]],
    metrics: dict[str, Any] | None = None,
    resolved: dict[str, Any] | None = None,
) -> dict[str, Any]:
    # every file but the manifest and the model card, which eval annotates with its results (cards.add_results)
    files = {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME and p.relative_to(folder) != Path(CARD_NAME)
    }
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "step": step,
        "kind": kind,
        "modelshrink_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "options": options,
        "resolved": resolved or {},
        "parents": parents,
        "files": files,
        "metrics": metrics or {},
        "environment": _environment(),
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def in_staging(path: Path) -> bool:
    """Whether `path` is, or lies inside, an unfinished run's staging folder (`.NAME.partial`) or is one of its
    work files (`run.partial.json`, the parts)."""
    return any(part.endswith(".partial") or ".partial." in part for part in path.resolve().parts)


def unfinished_input(spec: str, what: str = "") -> str:
    """The one line that refuses an input of an unfinished run (model or data)."""
    return (f"{what + ' ' if what else ''}{spec} belongs to an unfinished run (a .partial staging folder or work "
            "file), not to a finished artifact; finish that run with --resume and use its output")


def verify_files(folder: str | os.PathLike) -> list[str]:
    """Files whose content no longer matches the manifest (empty when intact)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise UserError(f"{folder} is not a modelshrink artifact (no {MANIFEST_NAME})")
    bad = []
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.is_file() or sha256_file(path) != digest:
            bad.append(name)
    return bad


RUN_FILE = "run.partial.json"


def _run_record(options: dict[str, Any], parents: list[dict[str, Any]], may_change: tuple[str, ...]) -> dict[str, Any]:
    return {"options": {k: v for k, v in options.items() if k not in may_change}, "parents": parents}


def check_run(staging: Path, options: dict[str, Any], parents: list[dict[str, Any]],
              may_change: tuple[str, ...] = ()) -> None:
    """Refuse to resume an unfinished run with other options (except `may_change`) or inputs with
    other content. Reads only, so every process of a launch can call it and fail alike."""
    run_file = staging / RUN_FILE
    if not run_file.exists():
        return
    run = _run_record(options, parents, may_change)
    before = json.loads(run_file.read_text())
    changed = sorted(k for k in set(before["options"]) | set(run["options"])
                     if before["options"].get(k) != run["options"].get(k))
    changed += [p["role"] + " content" for p, q in zip(run["parents"], before["parents"]) if p != q]
    if changed:
        raise UserError(f"the unfinished run in {staging} used other options or inputs ({', '.join(changed)}); "
                        "repeat it with the same ones, or pass --overwrite to start over")


def pin_run(staging: Path, options: dict[str, Any], parents: list[dict[str, Any]], may_change: tuple[str, ...] = ()) -> None:
    """Record what an unfinished run was started with, or check that a resumed run matches it: the
    same options (except `may_change`) and inputs with the same content."""
    check_run(staging, options, parents, may_change)
    temporary = staging / (RUN_FILE + ".tmp")  # a kill mid-write must not leave a torn record
    temporary.write_text(json.dumps(_run_record(options, parents, may_change), indent=2))
    os.replace(temporary, staging / RUN_FILE)


class ArtifactWriter:
    """Stage an artifact in `.NAME.partial` and move it to NAME once its manifest is written.

    The run holds a lock in the staging folder while it writes (see `locks`), so a second run on
    the same output is refused while the first lives. With `keep_on_failure` the staging folder
    survives an exception (so `--resume` can pick it up); otherwise it is removed, leaving nothing
    behind. `resumable` says whether the step has `--resume` (the default: `keep_on_failure`), for
    the hint given when an earlier run's staging folder is in the way.
    """

    def __init__(self, output: str | os.PathLike, *, overwrite: bool = False, resume: bool = False,
                 keep_on_failure: bool = False, resumable: bool | None = None):
        self.output = Path(output)
        self.staging = staging_path(self.output)
        self.overwrite = overwrite
        self.resume = resume
        self.keep_on_failure = keep_on_failure
        self.resumable = keep_on_failure if resumable is None else resumable
        self.committed = False

    def check(self) -> None:
        """Everything `open` would refuse, without touching the output: call it before slow work."""
        check_output(self.output, self.overwrite)
        if not self.staging.exists():
            return
        record = locks.holder(self.staging)
        if record is not None:
            raise locks.busy_error(self.output, record)
        if not (self.resume or self.overwrite):
            how = "pass --resume to continue it or --overwrite to start over" if self.resumable else \
                "pass --overwrite to start over"
            raise UserError(f"an unfinished earlier run left {self.staging}; {how}")

    def open(self) -> Path:
        self.check()
        if self.staging.exists() and self.resume:
            locks.acquire(self.staging, self.output)
            return self.staging
        if self.staging.exists():
            shutil.rmtree(self.staging)
        try:
            self.staging.mkdir()
        except FileExistsError:  # another run created it since `check`
            raise locks.busy_error(self.output, locks.holder(self.staging) or {"pid": "?"}) from None
        locks.acquire(self.staging, self.output)
        return self.staging

    def commit(self, *, step: str, kind: str, options: dict[str, Any], parents: list[dict[str, Any]],
               metrics: dict[str, Any] | None = None, resolved: dict[str, Any] | None = None) -> Path:
        locks.release(self.staging)
        write_manifest(self.staging, step=step, kind=kind, options=options, parents=parents, metrics=metrics,
                       resolved=resolved)
        old = None
        if self.output.exists():
            old = self.output.parent / f".{self.output.name}.old"
            if old.exists():
                shutil.rmtree(old)
            self.output.rename(old)
        self.staging.rename(self.output)
        if old is not None:
            shutil.rmtree(old)
        self.committed = True
        return self.output

    def __enter__(self) -> "ArtifactWriter":
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self.committed:
            if self.keep_on_failure:
                locks.release(self.staging)
            else:
                shutil.rmtree(self.staging, ignore_errors=True)
