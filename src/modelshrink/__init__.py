"""modelshrink: make transformer models small and fast while keeping their quality.

The Python API is the library behind the commands: one function a step, each taking its options object
(a dataclass whose fields are the command's options, with the same defaults and checks) and an output path,
and writing the same artifact the command writes. A bad value raises the `UserError` whose message the
command prints.

    import modelshrink
    from modelshrink import DistillOptions, EvalOptions, PseudolabelOptions

    labels = modelshrink.pseudolabel(PseudolabelOptions(teacher="teacher", data="docs.jsonl", lam=2.0), "labels")
    student = modelshrink.distill(DistillOptions(data=str(labels), teacher="teacher", decoder_layers=1,
                                                 epochs=3), "student")
    path, metrics = modelshrink.evaluate(EvalOptions(model=str(student), data="valid.jsonl"), "eval-student")

| function | command | returns |
|---|---|---|
| `pseudolabel(PseudolabelOptions, output)` | `modelshrink pseudolabel` | the dataset artifact's path |
| `distill(DistillOptions, output)` | `modelshrink distill` | the model artifact's path |
| `quantize(QuantizeOptions, output)` | `modelshrink quantize` | the model artifact's path |
| `contrastive(ContrastiveOptions, output)` | `modelshrink contrastive` | the classifier artifact's path |
| `evaluate(EvalOptions, output)` | `modelshrink eval` | (path, metrics) |
| `export(ExportOptions, output)` | `modelshrink export` | (path, report) |
| `load(folder)` | `modelshrink run` | an `ExportedModel` (torch-free: `summarize`, `classify`) |

Every step also takes `overwrite=` and, where the command has `--resume`, `resume=`; those that report
progress take `progress=` (a callable given each train_log line, or (done, total)) and `log=` (a callable
given each message line). Nothing is imported until first used, so `import modelshrink` stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from modelshrink._version import __version__

# name -> (module, attribute): imported on first use (torch and transformers come with the steps)
_API = {
    "pseudolabel": ("modelshrink.steps.pseudolabel", "pseudolabel"),
    "distill": ("modelshrink.steps.distill", "distill"),
    "quantize": ("modelshrink.steps.quantize", "quantize"),
    "contrastive": ("modelshrink.steps.contrastive", "contrastive"),
    "evaluate": ("modelshrink.steps.evaluate", "evaluate"),
    "export": ("modelshrink.steps.export", "export_model"),
    "load": ("modelshrink.runtime.model", "load"),
    "PseudolabelOptions": ("modelshrink.options.pseudolabel", "PseudolabelOptions"),
    "DistillOptions": ("modelshrink.options.distill", "DistillOptions"),
    "QuantizeOptions": ("modelshrink.options.quantize", "QuantizeOptions"),
    "ContrastiveOptions": ("modelshrink.options.contrastive", "ContrastiveOptions"),
    "EvalOptions": ("modelshrink.options.eval", "EvalOptions"),
    "ExportOptions": ("modelshrink.options.export", "ExportOptions"),
    "UserError": ("modelshrink.errors", "UserError"),
}
__all__ = ["__version__", *_API]

if TYPE_CHECKING:  # what type checkers and IDEs see
    from modelshrink.errors import UserError
    from modelshrink.options.contrastive import ContrastiveOptions
    from modelshrink.options.distill import DistillOptions
    from modelshrink.options.eval import EvalOptions
    from modelshrink.options.export import ExportOptions
    from modelshrink.options.pseudolabel import PseudolabelOptions
    from modelshrink.options.quantize import QuantizeOptions
    from modelshrink.runtime.model import load
    from modelshrink.steps.contrastive import contrastive
    from modelshrink.steps.distill import distill
    from modelshrink.steps.evaluate import evaluate
    from modelshrink.steps.export import export_model as export
    from modelshrink.steps.pseudolabel import pseudolabel
    from modelshrink.steps.quantize import quantize


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _API[name]
    value = getattr(import_module(module), attribute)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
