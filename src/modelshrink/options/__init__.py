"""Every step's options, each declared once.

An option is a dataclass field made by `opt(...)`: its name, type and default are the field's, and
its metadata (`Spec`) holds the help text, help panel, flag, allowed range and choices. Everything
else reads that one declaration:

- `Options.__post_init__` checks every value's type, range and choice (and refuses nan/inf) in one
  place, however the options were built (command line, recipe, Python); a step adds only its
  cross-field rules in `check()`;
- `modelshrink.commands._from_options` builds the Typer command from the fields;
- `recorded()` is what a manifest stores, keyed as on the command line, and is a valid `--config`
  recipe table for the same step (positional arguments included); `from_recorded` reads it back;
- `replay()` is the command line that repeats a run (every model card's Reproduce line).

This package imports neither torch nor typer, so `--help` stays fast.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from modelshrink.errors import UserError

META = "modelshrink"


@dataclass(frozen=True)
class Spec:
    """How one option appears on the command line and what values it takes."""

    help: str = ""
    panel: str | None = None
    flags: tuple[str, ...] = ()  # e.g. ("--lambda",) where the field name is not the flag
    metavar: str | None = None
    min: float | None = None  # value >= min
    above: float | None = None  # value > above
    max: float | None = None  # value <= max
    below: float | None = None  # value < below
    choices: tuple[Any, ...] | None = None
    argument: bool = False  # positional on the command line
    finite: bool = True  # refuse nan and ±inf (floats)


def opt(default: Any = None, help: str = "", **spec: Any) -> Any:
    """A field of an Options dataclass with its command-line declaration."""
    meta = {META: Spec(help=help, **spec)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


REQUIRED = dataclasses.MISSING


def spec_of(f: dataclasses.Field) -> Spec:
    return f.metadata.get(META, Spec())


def flag_of(f: dataclasses.Field) -> str:
    spec = spec_of(f)
    long = [x for x in spec.flags if x.startswith("--")]
    return long[0] if long else "--" + f.name.replace("_", "-")


def key_of(f: dataclasses.Field) -> str:
    """The option's name in a manifest or recipe: its flag without dashes, with underscores."""
    return flag_of(f)[2:].replace("-", "_")


def _choices_text(choices: tuple[Any, ...]) -> str:
    names = [str(c) for c in choices if c is not None]  # None: the option left out, not a value to type
    return " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)


def check_value(f: dataclasses.Field, value: Any) -> None:
    """One option's range, choices and finiteness; a UserError naming the flag otherwise."""
    spec = spec_of(f)
    if value is None:
        return
    flag = flag_of(f)
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and spec.finite and not math.isfinite(v):
            raise UserError(f"{flag} must be a finite number, got {v}")
        low = f"{spec.min:g}" if spec.min is not None else None
        if spec.min is not None and spec.below is not None and not spec.min <= v < spec.below:
            raise UserError(f"{flag} must be in [{low}, {spec.below:g}), got {v}")
        if spec.min is not None and spec.max is not None and not spec.min <= v <= spec.max:
            raise UserError(f"{flag} must be in [{low}, {spec.max:g}], got {v}")
        if spec.above is not None and spec.max is not None and not spec.above < v <= spec.max:
            raise UserError(f"{flag} must be in ({spec.above:g}, {spec.max:g}], got {v}")
        if spec.min is not None and not v >= spec.min:
            raise UserError(f"{flag} must be >= {low}, got {v}")
        if spec.above is not None and not v > spec.above:
            raise UserError(f"{flag} must be > {spec.above:g}, got {v}")
        if spec.max is not None and not v <= spec.max:
            raise UserError(f"{flag} must be <= {spec.max:g}, got {v}")
        if spec.below is not None and not v < spec.below:
            raise UserError(f"{flag} must be < {spec.below:g}, got {v}")
    if spec.choices is not None and value not in spec.choices:
        raise UserError(f"{flag} must be {_choices_text(spec.choices)}, got {value}")


TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def type_problem(value: Any, hint: Any) -> str | None:
    """What a value of type `hint` must be, where `value` is not one (None: it is). A list or tuple
    option takes a list or tuple of its items; a float option takes an int too."""
    if value is None:
        return None
    inner = _unwrap(hint)
    origin = typing.get_origin(inner)
    if origin in (list, tuple):
        items = [a for a in typing.get_args(inner) if a is not Ellipsis]
        if not isinstance(value, (list, tuple)):
            return f"a list of {len(items)} numbers" if origin is tuple else "a list"
        if origin is tuple and len(items) > 1 and len(value) != len(items):
            return f"a list of {len(items)} numbers"
        problems = [type_problem(v, items[0] if items else Any) for v in value]
        return next((f"{problem} for every item" for problem in problems if problem), None)
    if inner is bool:
        ok = isinstance(value, bool)
    elif inner is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif inner is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif inner is str:
        ok = isinstance(value, str)
    else:
        return None
    return None if ok else TYPE_NAMES[inner]


_HINTS: dict[type, dict[str, Any]] = {}


@dataclass(kw_only=True)
class Options:
    """Base of every step's options. Subclasses declare fields with `opt(...)` and put the rules
    that involve several options in `check()`."""

    STEP: ClassVar[str] = ""
    # An option that only makes sense with another: {option: the option it goes with}. Given (away from its
    # default) without that one (at its default), it is refused in one line. Subclasses add entries; a contract
    # test walks every class's table.
    GOES_WITH: ClassVar[dict[str, str]] = {}

    @classmethod
    def goes_with(cls) -> dict[str, str]:
        """GOES_WITH of this class and every options class it extends, for the fields it has."""
        table: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            table.update(getattr(klass, "GOES_WITH", {}) if "GOES_WITH" in vars(klass) else {})
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in table.items() if k in names and v in names}

    def _check_goes_with(self) -> None:
        table = self.goes_with()
        fields = {f.name: f for f in dataclasses.fields(self)}
        alone: dict[str, list[str]] = {}  # the option missing -> the given options that go with it, in field order
        for name in fields:
            if name in table and self.given({name}) and not self.given({table[name]}):
                alone.setdefault(table[name], []).append(flag_of(fields[name]))
        for needed, flags in alone.items():
            other = flag_of(fields[needed])
            metavar = spec_of(fields[needed]).metavar or "VALUE"
            usage = other if isinstance(getattr(self, needed), bool) else f"{other} {metavar}"
            one = len(flags) == 1
            raise UserError(f"{', '.join(flags)} {'goes' if one else 'go'} with {other}, which this run does not "
                            f"have: add {usage} or leave {flags[0] if one else 'them'} out")

    def __post_init__(self) -> None:
        hints = _HINTS.get(type(self)) or _HINTS.setdefault(type(self), field_types(type(self)))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, os.PathLike) and _unwrap(hints[f.name]) is str:
                value = os.fspath(value)  # a Path where a path is asked for: kept as the string a manifest records
                setattr(self, f.name, value)
            problem = type_problem(value, hints[f.name])
            if problem:
                raise UserError(f"{flag_of(f)} must be {problem}, got {value!r}")
            if f.name in TUPLE_FIELDS.get(type(self), ()) and isinstance(value, list):
                setattr(self, f.name, tuple(value))
            check_value(f, getattr(self, f.name))
        self._check_goes_with()
        self.check()

    def check(self) -> None:
        """Rules between options (one excludes another, one needs another)."""

    def given(self, names: set[str] | frozenset[str]) -> list[str]:
        """The flags of the fields among `names` whose value is not their default (what a user asked for)."""
        return [flag_of(f) for f in dataclasses.fields(self) if f.name in names and getattr(self, f.name) != (
            f.default if f.default is not dataclasses.MISSING else
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)]

    def recorded(self) -> dict[str, Any]:
        """The options as a manifest records them: keyed as on the command line, plain TOML/JSON
        values; a valid `--config` table for this step."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[key_of(f)] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_recorded(cls, recorded: dict[str, Any]) -> "Options":
        """The options back from `recorded()` (a manifest's `options`, or a recipe table)."""
        by_key = {key_of(f): f.name for f in dataclasses.fields(cls)}
        by_key.update({f.name: f.name for f in dataclasses.fields(cls)})
        unknown = sorted(k for k in recorded if k.replace("-", "_") not in by_key)
        if unknown:
            raise UserError(f"[{cls.STEP}] has no option {', '.join(unknown)}")
        return cls(**{by_key[k.replace("-", "_")]: v for k, v in recorded.items()})

    def replay(self, output: Any, always: tuple[str, ...] = ()) -> str:
        """The command line that repeats this run: positional arguments, `-o OUTPUT`, then every
        option that differs from its default (and those named in `always`)."""
        parts = ["modelshrink", self.STEP]
        options: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if spec_of(f).argument:
                if value is not None:
                    parts.append(str(value))
                continue
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            if (value == default and f.name not in always) or value is None:
                continue
            flag = flag_of(f)
            if isinstance(value, bool):
                options.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, list):
                options += [flag, ",".join(map(str, value))]
            elif isinstance(value, tuple):
                options += [flag, *map(str, value)]
            else:
                options += [flag, str(value)]
        return shlex.join(parts + ["-o", str(output)] + options)


# Fields typed as tuples (nargs > 1 on the command line): TOML and JSON bring them back as lists.
TUPLE_FIELDS: dict[type, set[str]] = {}


def field_types(cls: type) -> dict[str, Any]:
    """Each field's resolved type (the modules use `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


def _register_tuples(cls: type) -> type:
    hints = field_types(cls)
    TUPLE_FIELDS[cls] = {name for name, t in hints.items() if typing.get_origin(_unwrap(t)) is tuple}
    return cls


def _unwrap(t: Any) -> Any:
    """`X | None` -> X."""
    args = [a for a in typing.get_args(t) if a is not type(None)]
    if typing.get_origin(t) in (typing.Union, getattr(__import__("types"), "UnionType")) and len(args) == 1:
        return args[0]
    return t


def options_class(cls: type) -> type:
    """Decorator for a step's options: a keyword-only dataclass whose tuple fields are known."""
    return _register_tuples(dataclass(kw_only=True)(cls))


def to_toml(step: str, recorded: dict[str, Any]) -> str:
    """A manifest's `options` as a `[step]` recipe table (options that are None are left out: TOML
    has no null, and None is every such option's default)."""
    import json

    lines = [f"[{step}]"]
    for key, value in recorded.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        elif isinstance(value, str):
            text = json.dumps(value, ensure_ascii=False)
        elif isinstance(value, (list, tuple)):
            text = "[" + ", ".join(json.dumps(v) for v in value) + "]"
        else:
            raise TypeError(f"option {key} has a value TOML cannot hold: {value!r}")
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"
