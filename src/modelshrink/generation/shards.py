"""Generating over many processes: `pseudolabel` and `eval` under `accelerate launch` or `torchrun`.

Every process plans the same batches (the documents streamed, sorted by length within windows) and
runs every world_size-th of them, so a batch holds the same documents and padding whatever the
number of processes, and the rows written do not depend on it. Each process appends its rows, as
each batch finishes, to its own part file in the staging folder (`parts/part-R-of-W.jsonl`, every
row tagged with its input index); when every process has finished, the main process reads the parts
back in input order. A resumed run continues each part from its last complete row: nothing is lost
or written twice. A single process without a launcher is the same with one part.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from modelshrink.errors import UserError

PARTS = "parts"
ProgressFn = Callable[[int, int], None]


@dataclass
class Launch:
    """This process's place in the launch: rank, number of processes, and its device. It answers
    the few questions `runs.open_run` asks of an accelerate `Accelerator`, under the same names."""

    rank: int
    world: int
    device: str

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def is_main_process(self) -> bool:
        return self.main

    def owns(self, batch_number: int) -> bool:
        return batch_number % self.world == self.rank

    def wait_for_everyone(self) -> None:
        """Every process reaches this point before any goes on."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        """`value` of every process, in rank order (JSON-able values only)."""
        if self.world == 1:
            return [value]
        import torch.distributed as dist

        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return values

    def describe(self) -> str:
        return "1 process" if self.world == 1 else f"{self.world} processes"


def launch(device: str) -> Launch:
    """Where this process stands: under a launcher (WORLD_SIZE > 1) accelerate's PartialState joins
    the process group and picks this process's GPU (or the CPU with `--device cpu`, or `auto` on a
    machine without CUDA); alone, the device is `device` resolved."""
    from modelshrink.models.loading import resolve_device

    resolved = resolve_device(device)  # auto: the CPU on a machine without CUDA, launcher or not
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        state = PartialState(cpu=resolved == "cpu")
        chosen = "cpu" if resolved == "cpu" else str(state.device)
        return Launch(state.process_index, state.num_processes, chosen)
    return Launch(0, 1, resolved)


def part_path(staging: Path, rank: int, world: int) -> Path:
    return staging / PARTS / f"part-{rank:05d}-of-{world:05d}.jsonl"


def _complete_rows(path: Path, truncate: bool, duplicates: bool = False) -> dict[int, int]:
    """Input index -> byte offset of every complete row of a part file. A torn last line (the
    process died mid-write) ends the scan, and with `truncate` is cut off the file. With
    `duplicates`, an index written twice in the file is refused."""
    offsets: dict[int, int] = {}
    if not path.exists():
        return offsets
    good = 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            if not raw.endswith(b"\n"):
                break
            if duplicates and row["_index"] in offsets:
                raise UserError(f"row {row['_index']} is written twice in {path}: two runs wrote this staging "
                                "folder; start over with --overwrite")
            offsets[row["_index"]] = good
            good += len(raw)
    if truncate and good != path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good)
    return offsets


def run_part(batches: Iterable[Any], launch: Launch, staging: Path, run: Callable[[Any, set[int]], list[dict]],
             total: int, progress: ProgressFn | None = None) -> dict[str, int]:
    """Run this process's share of `batches` (objects with `.number` and `.rows`, rows with
    `.index`), appending what `run(batch, done)` returns (row dicts with "_index", one per row not
    in `done`) to this process's part file. Returns {"before": rows done by an earlier run (every
    process), "generated": rows generated now (every process)}. Progress reports the main process's
    rows × the number of processes (exact with one process)."""
    path = part_path(staging, launch.rank, launch.world)
    path.parent.mkdir(exist_ok=True)
    done = set(_complete_rows(path, truncate=True))
    before = sum(launch.gather(len(done)))
    if progress and launch.main:
        progress(min(total, before), total)
    generated = 0
    with open(path, "ab") as out:
        for batch in batches:
            if not launch.owns(batch.number) or all(e.index in done for e in batch.rows):
                continue
            rows = run(batch, done)
            for row in rows:
                out.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
                done.add(row["_index"])
            out.flush()
            generated += len(rows)
            if progress and launch.main:
                progress(min(total, before + generated * launch.world), total)
    generated = sum(launch.gather(generated))
    if progress and launch.main:
        progress(min(total, before + generated), total)
    return {"before": before, "generated": generated}


def merged_rows(staging: Path, world: int, total: int) -> Iterator[dict[str, Any]]:
    """Every part's rows, in input order 0 .. total-1, without their "_index" tags. Every index is
    checked: one outside 0 .. total-1, one written twice (two runs on one staging folder) or one
    missing stops the assembly rather than committing a wrong row."""
    where: dict[int, tuple[int, int]] = {}
    for rank in range(world):
        path = part_path(staging, rank, world)
        for index, offset in _complete_rows(path, truncate=False, duplicates=True).items():
            if not isinstance(index, int) or not 0 <= index < total:
                raise UserError(f"{path} holds a row with index {index!r}, outside 0..{total - 1}: it was not "
                                "written by this run; start over with --overwrite")
            if index in where:
                raise UserError(f"row {index} is in {path} and in {part_path(staging, where[index][0], world)}: "
                                "two runs wrote this staging folder; start over with --overwrite")
            where[index] = (rank, offset)
    missing = [i for i in range(total) if i not in where]
    if missing:  # every process has finished its share by now; a gap is a bug, not bad input
        raise RuntimeError(f"rows {missing[:5]} of {total} are in no part file of {staging / PARTS}")
    files = [open(part_path(staging, rank, world), "rb") for rank in range(world)]
    try:
        for index in range(total):
            rank, offset = where[index]
            files[rank].seek(offset)
            row = json.loads(files[rank].readline())
            if row.pop("_index") != index:
                raise RuntimeError(f"{part_path(staging, rank, world)} changed while it was read (row {index})")
            yield row
    finally:
        for f in files:
            f.close()


def has_rows(staging: Path) -> bool:
    """Whether any part file in `staging` holds a row (something a resumed run would keep)."""
    return any(p.stat().st_size > 0 for p in (staging / PARTS).glob("part-*.jsonl"))


def check_parts(staging: Path, world: int) -> None:
    """Refuse to resume parts written by another number of processes (each part holds the batches
    of one rank of one world size)."""
    folder = staging / PARTS
    if not folder.is_dir():
        return
    others = sorted({p.name.rsplit("-of-", 1)[-1].split(".")[0] for p in folder.glob("part-*-of-*.jsonl")}
                    - {f"{world:05d}"})
    if others:
        raise UserError(f"the unfinished run in {staging} was made by {int(others[0])} processes, this one has "
                        f"{world}; resume it with the same number of processes, or pass --overwrite to start over")


def noting_truncation(batches: Iterable[Any], max_tokens: int | None, truncated: list[str],
                      log: Callable[[str], None]) -> Iterator[Any]:
    """Pass `batches` through, logging each document cut to `max_tokens` (and adding its id to
    `truncated`). Every process plans every batch, so the main process alone sees them all."""
    for batch in batches:
        for example, length in batch.truncated:
            truncated.append(example.id)
            log(f"warning: document {example.id!r} has {length} tokens, more than --max-tokens {max_tokens}: "
                f"truncated to {max_tokens}")
        yield batch


def prefetched(items: Iterable[Any], depth: int = 2) -> Iterator[Any]:
    """`items` in order, produced by a background thread up to `depth` ahead: while the main thread waits on
    the GPU, the next batches are read and tokenized (the tokenizer releases the GIL). An exception in the
    producer is raised here; closing this iterator stops the producer."""
    import queue
    import threading

    box: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(entry: tuple[Any, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                box.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((end, None))
        except BaseException as error:  # handed to the consumer, which raises it
            put((end, error))

    thread = threading.Thread(target=produce, name="modelshrink-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = box.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
