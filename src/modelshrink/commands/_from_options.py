"""Typer commands generated from a step's Options dataclass, so each option is declared once.

`from_options(DistillOptions, extra=[OUTPUT, RESUME, OVERWRITE])` turns a function
`run(options, output, resume, overwrite)` into a Typer command whose parameters are the dataclass
fields (name, type, default, help, panel and flag from `opt(...)`) plus the extra ones. The
generated command builds the Options inside `handle_errors`, so a range or rule it breaks is one
line and exit 1. Every generated command also takes `--config RECIPE`: a TOML table of the step's
options (keys as in a manifest's `options`), which is how a manifest replays its run.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer  # its own copy of Click: parameters are matched by duck typing, not Click's classes

from modelshrink.commands._common import fail, handle_errors
from modelshrink.options import Options, _unwrap, flag_of, key_of, spec_of, type_problem

# step name -> its Options class, for recipes (`--config`) read by the root command too
OPTIONS_OF: dict[str, type[Options]] = {}


def param(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


OUTPUT = param("output", Annotated[Path, typer.Option("--output", "-o", help="Folder to write the artifact to.")])
RESUME = param("resume", Annotated[bool, typer.Option(help="Continue an interrupted run from its last checkpoint "
                                                           "(same options).")], False)
OVERWRITE = param("overwrite", Annotated[bool, typer.Option(help="Replace an existing output.")], False)
QUIET = param("quiet", Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or lines (errors, warnings "
                                                    "and the output path still print).")], False)


def is_list(f: dataclasses.Field, hints: dict[str, Any]) -> bool:
    return typing.get_origin(_unwrap(hints[f.name])) is list


def _parameter(f: dataclasses.Field, hint: Any) -> inspect.Parameter:
    spec = spec_of(f)
    inner = _unwrap(hint)
    optional = inner is not hint
    if typing.get_origin(inner) is list:  # layer ids: "0,6,11" on the command line
        kind: Any = Optional[str]
    elif optional:
        kind = Optional[inner]
    else:
        kind = inner
    info: dict[str, Any] = {"help": spec.help, "rich_help_panel": spec.panel}
    if spec.metavar:
        info["metavar"] = spec.metavar
    if spec.argument:
        declaration = typer.Argument(**info)
    else:
        decls = list(spec.flags)
        if inner is bool and not decls:
            flag = flag_of(f)[2:]
            decls = [f"--{flag}/--no-{flag}"]
        declaration = typer.Option(*decls, **info)
    default = inspect.Parameter.empty
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    return param(f.name, Annotated[kind, declaration], default)


def parse_ids(value: Any, flag: str) -> list[int] | None:
    """Comma-separated layer numbers ("0,6,11"), or a list from a recipe."""
    if value is None or isinstance(value, list):
        return value
    try:
        return [int(x) for x in str(value).replace(" ", "").strip("[]").split(",") if x != ""]
    except ValueError:
        raise fail(f"{flag} takes comma-separated layer numbers such as 0,6,11; got {value}") from None


def options_parameters(cls: type[Options]) -> tuple[list[inspect.Parameter], list[inspect.Parameter]]:
    """(positional arguments, options) of a command made from `cls`, in declaration order."""
    hints = typing.get_type_hints(cls)
    arguments, options = [], []
    for f in dataclasses.fields(cls):
        (arguments if spec_of(f).argument else options).append(_parameter(f, hints[f.name]))
    return arguments, options


def build_options(cls: type[Options], values: dict[str, Any]) -> Options:
    """The Options from a command's parsed values (layer ids parsed from "0,6,11")."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in values and is_list(f, hints):
            values[f.name] = parse_ids(values[f.name], flag_of(f))
    return cls(**values)


def recipe_defaults(command: Any, step: str, section: dict[str, Any], source: str) -> dict[str, Any]:
    """A recipe table as Click's default_map for `command`: keys are option names as in a manifest
    or on the command line (`num-beams`, `num_beams`, `lambda`); lists of layer ids become "0,6,11";
    a variadic argument (eval's MODEL DATA) collects the positional fields."""
    cls = OPTIONS_OF.get(step)
    names: dict[str, str] = {}
    for p in command.params:
        names[p.name] = p.name
        for decl in getattr(p, "opts", []) + getattr(p, "secondary_opts", []):
            names[decl.lstrip("-").replace("-", "_")] = p.name
    fields = {}
    hints = typing.get_type_hints(cls) if cls is not None else {}
    if cls is not None:
        for f in dataclasses.fields(cls):
            fields[key_of(f)] = fields[f.name] = f
    variadic = next((p for p in command.params if p.param_type_name == "argument" and p.nargs == -1), None)
    values: dict[str, Any] = {}
    positional: dict[str, Any] = {}
    for key, value in section.items():
        k = key.replace("-", "_")
        f = fields.get(k)
        if variadic is not None and f is not None and spec_of(f).argument:
            positional[f.name] = value
            continue
        name = names.get(k)
        if name is None:
            raise fail(f"config {source}: [{step}] has no option '{key}'")
        if f is not None:
            _check_type(value, hints[f.name], f"config {source}: [{step}] {key} = {value!r}")
        if isinstance(value, list) and f is not None and is_list(f, hints):
            value = ",".join(map(str, value))
        values[name] = value
    if positional:
        order = [f.name for f in dataclasses.fields(cls) if spec_of(f).argument]
        values[variadic.name] = [positional[n] for n in order if positional.get(n) is not None]
    return values


def _check_type(value: Any, hint: Any, where: str) -> None:
    """A recipe value of the option's type, else one line naming the file, the key and what it takes (Click would
    name only the flag: "Invalid value for '--num-beams'"). Layer ids may be written "0,6,11"."""
    if isinstance(value, str) and typing.get_origin(_unwrap(hint)) is list:
        return
    problem = type_problem(value, hint)
    if problem:
        raise fail(f"{where}: expected {problem}" + (" (in quotes)" if problem == "a string" else ""))


def read_recipe(path: Path) -> dict[str, Any]:
    import tomllib

    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise fail(f"cannot read config {path}: {e}") from None


def _config_callback(step: str):
    def load(ctx: Any, _param: Any, value: Optional[Path]) -> None:
        if value is None:
            return
        table = read_recipe(value)
        # a recipe file with a [step] table, or the step's options alone (a manifest's `options` as TOML)
        section = table.get(step) if isinstance(table.get(step), dict) else table
        if any(isinstance(v, dict) for v in section.values()):
            raise fail(f"config {value}: expected a [{step}] table or {step}'s options at the top level")
        defaults = recipe_defaults(ctx.command, step, section, str(value))
        ctx.default_map = {**(ctx.default_map or {}), **defaults}

    return load


def from_options(cls: type[Options], *, extra: list[inspect.Parameter] = (),
                 arguments: list[inspect.Parameter] | None = None, construct: bool = True):
    """Decorator: `run(options, **extra)` becomes a Typer command with the Options fields as its
    parameters. `arguments` replaces the positional fields (eval's variadic MODEL DATA); with
    `construct=False` run gets the fields' values as a dict and builds the Options itself."""
    step = cls.STEP
    OPTIONS_OF[step] = cls

    def decorate(run: Callable[..., None]) -> Callable[..., None]:
        positional, options = options_parameters(cls)
        config = param("config", Annotated[Optional[Path], typer.Option(
            "--config", "-c", exists=True, dir_okay=False, is_eager=True, callback=_config_callback(step),
            help=f"TOML recipe: a [{step}] table, or a manifest's options, keyed as the options here; the command "
                 "line wins.")], None)
        head = [p for p in extra if p.name == "output"]  # -o right after the positional arguments in --help
        tail = [p for p in extra if p.name != "output"]
        signature = inspect.Signature([*(positional if arguments is None else arguments), *head, *options, *tail,
                                       config])
        names = {p.name for p in (positional if arguments is None else []) + options}

        @functools.wraps(run)
        def command(**kwargs: Any) -> None:
            kwargs.pop("config", None)
            values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            if not construct:
                return run(values, **kwargs)
            with handle_errors():
                options = build_options(cls, values)
            run(options, **kwargs)

        del command.__wrapped__  # Typer must read the generated signature, not run's
        command.__signature__ = signature
        command.__annotations__ = {}
        return command

    return decorate
