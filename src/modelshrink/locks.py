"""One run per output: a lock file in the staging folder.

The run that writes `.NAME.partial` holds `.NAME.partial/run.lock` (its pid, host and start time,
created with O_EXCL). A second run on the same output — a second `--resume`, an `--overwrite`, a
plain rerun — is refused with one line while the holder lives. A lock never blocks forever:

- on the same host, a lock whose process is gone is stale (kill -9, a crash, a lost machine);
- from another host (a shared filesystem), where the pid cannot be checked, a lock whose file has
  not been touched for `STALE_SECONDS` is stale: the holder touches it every `HEARTBEAT_SECONDS`.

The holder's own process may take its lock again (a second step in one process, after an error).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from modelshrink.errors import UserError

LOCK_NAME = "run.lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0

_heartbeats: dict[Path, threading.Event] = {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def holder(staging: Path) -> dict[str, Any] | None:
    """Who holds the lock of `staging`, if it is held by another live run; None when free, stale or ours."""
    path = Path(staging) / LOCK_NAME
    try:
        record = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # torn by a crash while it was being written
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    if record.get("host") == socket.gethostname():
        if record["pid"] == os.getpid() or not _alive(record["pid"]):
            return None
        return record
    return record if age < STALE_SECONDS else None


def busy_error(output: Path, record: dict[str, Any]) -> UserError:
    return UserError(f"another run (pid {record['pid']} on {record.get('host', '?')}, started "
                     f"{record.get('started', '?')}) is writing {output}; wait for it to finish or stop it first")


def acquire(staging: Path, output: Path) -> None:
    """Take the lock of `staging` for this process, or refuse with one line if a live run holds it."""
    path = Path(staging) / LOCK_NAME
    record = holder(staging)
    if record is not None:
        raise busy_error(output, record)
    path.unlink(missing_ok=True)  # stale, or ours
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another run took it between the two lines above
        raise busy_error(output, holder(staging) or {"pid": "?"}) from None
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": started}, f)
    _start_heartbeat(path)


def release(staging: Path) -> None:
    """Drop this process's lock of `staging` (a lock of another process stays)."""
    path = Path(staging) / LOCK_NAME
    stop = _heartbeats.pop(path, None)
    if stop is not None:
        stop.set()
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if record.get("pid") == os.getpid() and record.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)


def _start_heartbeat(path: Path) -> None:
    """Touch the lock every HEARTBEAT_SECONDS while it exists, so that other hosts see it live."""
    old = _heartbeats.pop(path, None)
    if old is not None:
        old.set()
    stop = threading.Event()
    _heartbeats[path] = stop

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(path)
            except OSError:  # committed (renamed) or removed: nothing left to keep alive
                return

    threading.Thread(target=beat, name="modelshrink-lock", daemon=True).start()
