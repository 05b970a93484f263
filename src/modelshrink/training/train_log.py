"""train_log.jsonl: one JSON line per log step and validation of a training run (main process only), kept
consistent with the latest checkpoint on resume, and every line sent to --report-to's trackers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from modelshrink.training.checkpoints import TrainState


class TrainLog:
    """train_log.jsonl (main process only) and the throughput of the steps since the last line."""

    def __init__(self, path: Path, main: bool):
        self.path, self.main = path, main
        self.window_tokens, self.window_start = 0, time.perf_counter()
        self.trackers: Any = None  # --report-to's (tracking.Trackers): every line written goes to them too

    def start(self, resumed_at: int | None) -> None:
        if not self.main or not self.path.exists():
            return
        if resumed_at is None:
            self.path.unlink()
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # torn: the process was killed while writing it
                break
            if entry["step"] > resumed_at:  # written after the checkpoint: the resumed run writes it again
                break
            kept.append(line)
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, entry: dict[str, Any]) -> None:
        if self.main:
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")
            if self.trackers is not None:
                self.trackers.log(entry)

    def line(self, state: TrainState, parts: dict[str, float], lr: float, batches: int, total: int,
             progress: Callable[[dict[str, Any]], None] | None) -> None:
        """The line of a log step: `parts` are this step's, `window_tokens` those of the steps since the last line."""
        now = time.perf_counter()
        rate = self.window_tokens / max(now - self.window_start, 1e-9)
        entry = {"step": state.step, "epoch": round(state.epoch + state.batch_in_epoch / batches, 4),
                 "lr": lr, "tokens": self.window_tokens, "seconds": round(now - self.window_start, 4),
                 "tokens_per_s": round(rate, 1), **{k: round(v, 5) for k, v in parts.items()}}
        self.write(entry)
        if self.main and progress:
            progress({**entry, "total_steps": total})
        self.window_tokens, self.window_start = 0, now
