"""What a model folder's files must be before anything loads them: readable JSON, whole safetensors,
and no pickles unless the user asks for them.

Libraries report a damaged file late and in their own words (a truncated `model.safetensors` is a
`SafetensorError: incomplete metadata` traceback; a damaged `generation_config.json` is silently
replaced by defaults). Checking the folder first turns each into one line naming the file.

Pickle checkpoints (`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`) can run code when they are
loaded, so a folder whose only weights are pickles is refused; `--allow-pickle` loads them with
`torch.load(weights_only=True)` (what transformers does), which reads tensors only.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from modelshrink.errors import UserError

PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
# pickles beside the weights that no model loader reads (a Trainer's leftovers)
NOT_WEIGHTS = {"training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt"}


def _fingerprint(folder: Path) -> tuple:
    return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))


# the files of a model folder that transformers reads as JSON objects (a folder may hold other JSON: the packaged
# MiniLM's data_config.json is a list)
OBJECTS = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json")


def check_files(folder: str | Path, what: str, weights: bool = False, allow_pickle: bool = False) -> None:
    """Refuse, with one line naming the file, a model folder whose JSON files do not parse or (with
    `weights`) whose safetensors are damaged, or whose only weights are pickles (without `allow_pickle`)."""
    folder = Path(folder)
    _check(folder, _fingerprint(folder), what, weights, allow_pickle)


@functools.lru_cache(maxsize=64)
def _check(folder: Path, _fingerprint: tuple, what: str, weights: bool, allow_pickle: bool) -> None:
    # (the fingerprint keys the cache: a folder whose files changed is checked again)
    for path in sorted(folder.glob("*.json")):
        try:
            parsed = json.loads(path.read_bytes())
        except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(f"cannot load {what} from {folder}: {path.name} is damaged or incomplete "
                            f"(not valid JSON: {str(e).splitlines()[0]})") from None
        if path.name in OBJECTS and not isinstance(parsed, dict):  # what a loader does with another JSON value
            # is its version's detail (transformers 5.15 fails on a list with a TypeError)
            raise UserError(f"cannot load {what} from {folder}: {path.name} is damaged (a JSON "
                            f"{type(parsed).__name__}, not an object)")
    if not weights:
        return
    _check_shards(folder, what, "*.safetensors.index.json")
    tensors = sorted(folder.glob("*.safetensors"))
    for path in tensors:
        damaged = safetensors_problem(path)
        if damaged:
            raise UserError(f"cannot load {what} from {folder}: {path.name} is damaged or incomplete ({damaged})")
    if tensors:
        return
    pickles = pickle_weights(folder)
    if pickles and not allow_pickle:
        raise UserError(f"{what} {folder} holds its weights only as a pickle ({', '.join(pickles)}); pickles can run "
                        "code when loaded, so they are refused: convert it once with save_pretrained (safetensors), "
                        "or pass --allow-pickle to load it with torch.load(weights_only=True)")
    _check_shards(folder, what, "*.bin.index.json")
    for name in pickles:
        damaged = pickle_problem(folder / name)
        if damaged:
            raise UserError(f"cannot load {what} from {folder}: {name} is damaged or incomplete ({damaged})")


def pickle_weights(folder: Path) -> list[str]:
    """The pickle files of a folder that may be its weights."""
    return sorted({p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern)} - NOT_WEIGHTS)


def _check_shards(folder: Path, what: str, pattern: str) -> None:
    """Every shard that an index (model.safetensors.index.json, pytorch_model.bin.index.json) lists is there;
    a missing one would otherwise surface as a bare 'No such file or directory'."""
    for index in sorted(folder.glob(pattern)):
        listing = json.loads(index.read_bytes())
        weight_map = listing.get("weight_map") if isinstance(listing, dict) else None
        for shard in sorted(set(weight_map.values()) if isinstance(weight_map, dict) else ()):
            if not (folder / str(shard)).is_file():
                raise UserError(f"cannot load {what} from {folder}: {shard} is missing ({index.name} lists it)")


def pickle_problem(path: Path) -> str | None:
    """Why a torch.save file is certainly damaged (empty, or a zip archive without its end), or None. A
    whole file can still be refused by torch.load(weights_only=True) when it holds more than tensors."""
    import zipfile

    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "empty file"
    if head.startswith(b"PK") and not zipfile.is_zipfile(path):  # torch.save's zip format, cut short
        return "a torch.save zip archive without its central directory: truncated?"
    if not head.startswith((b"PK", b"\x80")):  # neither torch.save's zip nor a pickle's protocol byte
        return "neither a torch.save archive nor a pickle"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be read (its header, and that the file holds every tensor the
    header names), or None when it is whole. Reads the header only."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        return str(e).splitlines()[0]
    return None
