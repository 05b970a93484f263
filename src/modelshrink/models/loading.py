"""Loading and saving models: local `save_pretrained` folders, modelshrink artifacts, hub names.

A hub name works where the local Hugging Face cache has it; offline and uncached it fails with one
clear line. `trust_remote_code` stays off unless the user asks for it.
"""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from modelshrink.errors import UserError
from modelshrink.families import ENCODER_DECODER_TYPE, Family, family_of
from modelshrink.models.fit import drop_unembedded, tokenizer_misfit, unembedded_specials
from modelshrink.models.files import check_files, pickle_weights


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _failure(e: Exception, what: str, spec: str, folder: Path | None) -> str:
    """One line for a loader's failure; a pickle that torch.load(weights_only=True) refused is named
    (its own message advises weights_only=False, which this tool never does)."""
    if isinstance(e, (EOFError, pickle.UnpicklingError)):
        names = ", ".join(pickle_weights(folder)) if folder is not None else ""
        return (f"cannot load {what} from {spec}: {names or 'its pickle weights'} is damaged, or holds more than "
                f"tensors, which torch.load(weights_only=True) refuses ({type(e).__name__})")
    return f"cannot load {what} from {spec}: {_first_line(e)}"


def _config_field_errors() -> tuple[type[Exception], ...]:
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # older huggingface_hub: configs are not strict there
        return ()
    return (StrictDataclassError,)


def _load_errors() -> tuple[type[Exception], ...]:
    """What the loaders raise for a missing, damaged or unreadable file (JSONDecodeError and UnicodeDecodeError
    are ValueErrors; huggingface_hub's strict dataclasses raise their own type for a config.json field of the
    wrong type); pickle errors come from --allow-pickle's torch.load."""
    from safetensors import SafetensorError

    return (OSError, ValueError, SafetensorError, EOFError, pickle.UnpicklingError, *_config_field_errors())


def _local_folder(spec: str, what: str) -> Path | None:
    """`spec` as a local model folder, checked (not a staging folder, not a file, its JSON files whole); None for
    a hub name; a UserError for a path that does not exist."""
    from modelshrink.artifacts import in_staging, unfinished_input

    path = Path(spec).expanduser()
    if path.exists():
        if in_staging(path):
            raise UserError(unfinished_input(spec, what))
        if not path.is_dir():
            raise UserError(f"{what} {spec} is a file; expected a model folder (save_pretrained) or a hub name")
        check_files(path, what)
        return path
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise UserError(f"{what} {spec} does not exist")
    return None


def _from_folder(loader: Callable[..., Any], path: Path, spec: str, what: str, **kwargs: Any) -> Any:
    try:
        return loader(str(path), **kwargs)
    except _load_errors() as e:
        raise UserError(_failure(e, what, spec, path)) from None
    except RuntimeError as e:  # torch.load on a cut pre-1.6 (non-zip) pickle; any other RuntimeError is a bug
        if pickle_weights(path) and "corrupted" in str(e):
            raise UserError(_failure(EOFError(), what, spec, path)) from None
        raise


def _from_hub(loader: Callable[..., Any], spec: str, what: str, cached: Path | None, **kwargs: Any) -> Any:
    """A hub name from the cache first (`cached`: its snapshot, JSON already checked), then the hub."""
    from safetensors import SafetensorError

    try:
        return loader(spec, local_files_only=True, **kwargs)
    except (EOFError, pickle.UnpicklingError) as e:
        raise UserError(_failure(e, what, spec, cached)) from None
    except (OSError, ValueError, SafetensorError) as cached_error:
        if _hub_offline():
            raise UserError(f"{what} {spec} is not a local folder and is not in the Hugging Face cache "
                            "(offline: HF_HUB_OFFLINE is set)") from None
        try:
            return loader(spec, **kwargs)
        except Exception as e:  # network errors come in many types
            if kwargs.get("use_safetensors") and isinstance(e, OSError) and "safetensors" in str(e):
                raise UserError(f"{what} {spec} has no safetensors weights on the hub; pickle weights can run code "
                                "when loaded, so they are refused: pass --allow-pickle to load them with "
                                "torch.load(weights_only=True)") from None
            raise UserError(f"{what} {spec} is not a local folder, not in the Hugging Face cache, and could not "
                            f"be downloaded: {_first_line(e)} (cache: {_first_line(cached_error)})") from None


def from_pretrained(loader: Callable[..., Any], spec: str, what: str, **kwargs: Any) -> Any:
    """Call `loader(spec)`: a local folder as is, a hub name from the cache first, then the hub. The folder's JSON
    files (a cached hub name's too) are checked first (`models.files`), so a damaged one is named. Loading several
    things of one model: `resolve` it once, then `ModelSource.load`."""
    return _locate(spec, what).load(loader, **kwargs)


def cached_folder(spec: str) -> Path | None:
    """The folder that holds `spec`: itself when it is a local folder, else the Hugging Face cache's
    snapshot of the hub name (None when it is not cached)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception:  # not a hub name, or not cached: the loader says which
        return None


@dataclass
class ModelSource:
    """A model named by the user, resolved once: where its files are, its config, its family, whether it is a
    modelshrink-quantized artifact; its weights checked and its tokenizer read once, on first use. A step resolves
    each model it is given when it starts (`resolve`) and passes this down, so that no helper looks the name up,
    reads the config or checks the files again."""

    spec: str  # as the user gave it: a folder, an artifact or a hub name
    what: str  # what the user called it, for messages: "teacher", "model", "student", ...
    config: Any
    folder: Path | None  # the local folder, or the cache's snapshot of a hub name (None: neither has it)
    local: bool  # a local folder (else a hub name)
    trust_remote_code: bool = False
    allow_pickle: bool = False
    quantized: bool = False  # a modelshrink-quantized artifact (`quant.model.is_quantized`), known once resolved
    _tokenizer: Any = field(default=None, repr=False)
    _weights: dict[str, Any] | None = field(default=None, repr=False)

    def __str__(self) -> str:  # in messages, the model as the user named it
        return self.spec

    @property
    def family(self) -> Family:
        return family_of(self.config)

    @property
    def task(self) -> str:
        return task_of(self.config)

    def load(self, loader: Callable[..., Any], what: str | None = None, **kwargs: Any) -> Any:
        """`loader` (a `from_pretrained`) on this model's files, with the same one-line failures."""
        what = what or self.what
        if self.local:
            return _from_folder(loader, self.folder, self.spec, what, **kwargs)
        return _from_hub(loader, self.spec, what, self.folder, **kwargs)

    def weights_kwargs(self) -> dict[str, Any]:
        """The weights checked, once (damaged safetensors, pickles: see `models.files`); what the loader needs to
        follow the same pickle policy on the hub."""
        if self._weights is None:
            if self.folder is not None:
                check_files(self.folder, self.what, weights=True, allow_pickle=self.allow_pickle)
            # transformers reads pickles with weights_only=True already; said here so no default change undoes it
            self._weights = {"weights_only": True} if self.allow_pickle else {"use_safetensors": True}
        return self._weights

    def tokenizer(self) -> Any:
        """The model's tokenizer, read once; with a config, one that does not fit the model is refused."""
        if self._tokenizer is None:
            self._tokenizer = _read_tokenizer(self)
        return self._tokenizer


def _locate(spec: str, what: str, trust_remote_code: bool = False, allow_pickle: bool = False,
            config: Any = None) -> ModelSource:
    """Where `spec`'s files are: a local folder (checked), or a cached hub name's snapshot (its JSON checked)."""
    path = _local_folder(spec, what)
    folder = path if path is not None else cached_folder(spec)
    if path is None and folder is not None:
        check_files(folder, what)
    return ModelSource(spec, what, config, folder, path is not None, trust_remote_code, allow_pickle)


def resolve(spec: "str | ModelSource", what: str = "model", trust_remote_code: bool = False,
            allow_pickle: bool = False) -> ModelSource:
    """`spec` resolved once into a `ModelSource` (its files found and checked, its config read); a `ModelSource`
    is returned as it is."""
    from transformers import AutoConfig

    from modelshrink.quant.model import is_quantized

    if isinstance(spec, ModelSource):
        return spec
    source = _locate(str(spec), what, trust_remote_code, allow_pickle)
    source.config = source.load(AutoConfig.from_pretrained, trust_remote_code=trust_remote_code)
    source.quantized = is_quantized(source.config)
    return source


def load_config(spec: "str | ModelSource", what: str = "model", trust_remote_code: bool = False) -> Any:
    return resolve(spec, what, trust_remote_code).config


def load_tokenizer(spec: "str | ModelSource", what: str = "model", trust_remote_code: bool = False,
                   config: Any = None) -> Any:
    """The model's tokenizer; with the model's `config` (a `ModelSource` always has it), one that does not fit
    the model is refused."""
    if isinstance(spec, ModelSource):
        return spec.tokenizer()
    return _locate(str(spec), what, trust_remote_code, config=config).tokenizer()


def _read_tokenizer(source: ModelSource) -> Any:
    from transformers import AutoTokenizer

    try:
        known = {"config": source.config} if source.config is not None else {}  # not read again to find the class
        tokenizer = source.load(AutoTokenizer.from_pretrained, f"tokenizer of {source.what}",
                                trust_remote_code=source.trust_remote_code, **known)
    except (TypeError, KeyError) as e:
        raise UserError(f"{source.what} {source.spec} has no usable tokenizer: {_first_line(e)}") from None
    except ImportError as e:  # transformers: "M2M100Tokenizer requires the SentencePiece library but it was not found"
        needed = re.search(r"requires the (\S+) library", str(e))
        package = needed.group(1).lower() if needed else _first_line(e)
        raise UserError(f"{source.what} {source.spec}: its tokenizer needs the {package} package, which is not "
                        f"installed: pip install {package}") from None
    why = tokenizer_misfit(tokenizer, source.config) if source.config is not None else None
    if not why and source.config is not None and (unreadable := unembedded_specials(tokenizer, source.config)):
        drop_unembedded(tokenizer, unreadable)
    if why:
        folder = Path(source.folder or source.spec)
        files = sorted(p.name for p in folder.glob("*") if p.name.startswith(("tokenizer", "vocab", "merges",
                                                                              "special_tokens", "spiece", "source",
                                                                              "target", "sentencepiece")))
        raise UserError(f"{source.what} {source.spec}: its tokenizer does not fit the model ({why}); its tokenizer "
                        f"files ({', '.join(files) or 'none'}) are incomplete or belong to another model")
    return tokenizer


def describe(config: Any) -> str:
    architectures = ", ".join(getattr(config, "architectures", None) or []) or "no architectures listed"
    return f"a {config.model_type} model ({architectures})"


def load_seq2seq(spec: "str | ModelSource", what: str = "teacher", trust_remote_code: bool = False,
                 device: str = "cpu", allow_pickle: bool = False) -> tuple[Any, Any, Family]:
    """Load an encoder-decoder model, its tokenizer and its family adapter, in eval mode. Pickle
    weights are refused unless `allow_pickle` (then read with weights_only). `spec` may be resolved already
    (`resolve`); its own `what`, `trust_remote_code` and `allow_pickle` hold then."""
    from transformers import AutoModelForSeq2SeqLM, EncoderDecoderModel

    from modelshrink.quant.model import load_quantized

    source = resolve(spec, what, trust_remote_code, allow_pickle)
    config = source.config
    if not getattr(config, "is_encoder_decoder", False):
        raise UserError(f"{source.what} {source.spec} is not an encoder-decoder (seq2seq) model: it is "
                        f"{describe(config)}")
    family = family_of(config)
    weights = source.weights_kwargs()
    if source.quantized:
        model = load_quantized(source.folder or source.spec)
        return model.to(device).eval(), source.tokenizer(), family
    loader = EncoderDecoderModel if config.model_type == ENCODER_DECODER_TYPE else AutoModelForSeq2SeqLM
    model = source.load(loader.from_pretrained, config=config, trust_remote_code=source.trust_remote_code, **weights)
    freeze_computed_tables(model)
    tokenizer = source.tokenizer()
    model.to(device).eval()
    return model, tokenizer, family


def freeze_computed_tables(model: Any) -> list[str]:
    """Tables the architecture computes from their shape (a module's `create_weight`: Marian's, Pegasus' and
    M2M100's sinusoidal positions) are no parameters to train: a freshly built model has them frozen, but
    `from_pretrained` (transformers 5) hands them back with requires_grad=True, so that training moved them,
    quantize then had to store them (in float32) although a budget plan counts them as recomputed. Freezes them
    in place; returns the frozen parameters' names."""
    from modelshrink.quant.model import computed_tables

    frozen = []
    for prefix, module in computed_tables(model):
        weight = module._parameters.get("weight")
        if weight is not None and weight.requires_grad:
            weight.requires_grad_(False)
            frozen.append(f"{prefix}.weight")
    return frozen


def task_of(config: Any) -> str:
    """What a model does: "summarization" (encoder-decoder), "classification" or "regression"."""
    if getattr(config, "is_encoder_decoder", False):
        return "summarization"
    if is_classifier(config):
        regression = getattr(config, "problem_type", None) == "regression" or getattr(config, "num_labels", 2) == 1
        return "regression" if regression else "classification"
    raise UserError(f"the model is {describe(config)}; expected a seq2seq summarizer or a sequence classifier "
                    "(an *ForSequenceClassification architecture)")


def is_classifier(config: Any) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])


def load_classifier(spec: "str | ModelSource", what: str = "model", trust_remote_code: bool = False,
                    device: str = "cpu", new_head: dict[str, Any] | None = None,
                    allow_pickle: bool = False) -> tuple[Any, Any]:
    """Load a sequence classifier and its tokenizer, in eval mode. A pretrained encoder without a
    classification head (e.g. MiniLM) gets a new, randomly initialised one configured by `new_head`
    (num_labels, id2label, label2id, problem_type); without `new_head` it is refused. `spec` may be resolved
    already (`resolve`)."""
    from transformers import AutoModelForSequenceClassification

    from modelshrink.quant.model import load_quantized

    source = resolve(spec, what, trust_remote_code, allow_pickle)
    config = source.config
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"{source.what} {source.spec} is a seq2seq model, not a sequence classifier: it is "
                        f"{describe(config)}")
    weights = source.weights_kwargs()
    if source.quantized:
        model = load_quantized(source.folder or source.spec)
    else:
        head = {}
        if not is_classifier(config):
            if new_head is None:
                raise UserError(f"{source.what} {source.spec} is not a sequence classifier: it is "
                                f"{describe(config)}")
            head = new_head
        known = {} if head else {"config": config}  # a new head's labels go to the config the loader reads
        model = source.load(AutoModelForSequenceClassification.from_pretrained,
                            trust_remote_code=source.trust_remote_code, **weights, **head, **known)
        if head:
            model.config.architectures = [type(model).__name__]  # saved as a classifier from now on
    tokenizer = source.tokenizer()
    model.to(device).eval()
    return model, tokenizer


def save_model(model: Any, tokenizer: Any, folder: str | os.PathLike) -> None:
    """Write a model in `save_pretrained` form (safetensors, generation config, tokenizer)."""
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def tokenizer_mismatch(a: Any, b: Any) -> str | None:
    """Why two tokenizers differ for word-level losses (which compare distributions over ids)."""
    if len(a) != len(b):
        return f"vocabulary sizes differ ({len(a)} and {len(b)})"
    if a.get_vocab() != b.get_vocab():
        return "the same size but different token ids"
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "cls_token_id", "sep_token_id"):
        if getattr(a, name, None) != getattr(b, name, None):
            return f"different {name} ({getattr(a, name, None)} and {getattr(b, name, None)})"
    return None


def resolve_device(device: str) -> str:
    """`--device` as a run uses it: auto is CUDA where there is one, except under `accelerate launch --cpu`."""
    import torch

    if device == "auto":
        if os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in ("1", "true", "yes", "y", "on"):
            return "cpu"
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device} was asked for but no CUDA device is available")
    return device


def _positions(config: Any) -> int | None:
    for holder in (config, getattr(config, "encoder", None)):
        positions = getattr(holder, "max_position_embeddings", None)
        if positions:
            return int(positions)
    return None


def default_source_length(tokenizer: Any, config: Any) -> int:
    """Truncation length for documents: the smaller of the tokenizer's model_max_length and the
    model's positions (a small model built from a config often reuses a bigger model's tokenizer,
    and a document longer than the positions would index past the position table)."""
    limits = []
    limit = getattr(tokenizer, "model_max_length", None)
    if limit and limit < 100_000:
        limits.append(int(limit))
    positions = _positions(config)
    if positions:
        limits.append(positions)
    return min(limits) if limits else 1024


def source_length(asked: int | None, tokenizer: Any, config: Any, flag: str = "--max-source-length",
                  preferred: int | None = None) -> int:
    """The truncation length a step uses: `asked` where given (refused, with one line, when the
    model has fewer positions), else the default above, capped at `preferred` (a paper's setting)."""
    positions = _positions(config)
    if asked is not None:
        if positions is not None and asked > positions:
            raise UserError(f"{flag} {asked} is more than the model's {positions} positions "
                            "(max_position_embeddings); give at most that")
        return asked
    default = default_source_length(tokenizer, config)
    return min(default, preferred) if preferred else default
