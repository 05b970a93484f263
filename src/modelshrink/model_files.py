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

PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")
# pickles beside the weights that no model loader reads (a Trainer's leftovers)
NOT_WEIGHTS = {"training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt"}


def _fingerprint(folder: Path) -> tuple:
    return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))


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
            json.loads(path.read_bytes())
        except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(f"cannot load {what} from {folder}: {path.name} is damaged or incomplete "
                            f"(not valid JSON: {str(e).splitlines()[0]})") from None
    if not weights:
        return
    tensors = sorted(folder.glob("*.safetensors"))
    for path in tensors:
        damaged = safetensors_problem(path)
        if damaged:
            raise UserError(f"cannot load {what} from {folder}: {path.name} is damaged or incomplete ({damaged})")
    if tensors:
        return
    pickles = sorted({p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern)} - NOT_WEIGHTS)
    if pickles and not allow_pickle:
        raise UserError(f"{what} {folder} holds its weights only as a pickle ({', '.join(pickles)}); pickles can run "
                        "code when loaded, so they are refused: convert it once with save_pretrained (safetensors), "
                        "or pass --allow-pickle to load it with torch.load(weights_only=True)")


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
