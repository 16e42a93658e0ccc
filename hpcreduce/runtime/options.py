"""Settings declared once: a config's dataclass fields carry their command-line form.

    steps: int = option(200, "--steps", "training steps", metavar="S", bound=AT_LEAST_ONE)

``option`` makes a dataclass field whose metadata is an ``Option``: the flag, its help and
metavar, how its text becomes a value (``parse``; a ValueError is the flag's problem), whether
it repeats or is a switch, the range its value must lie in (``bound``) or the values it may
take (``choices``), and the settings it does nothing without (``needs``: ``--checkpoint-keep``
needs ``--checkpoint-dir``; ``partner_problems`` refuses it given alone). The command line
builds its flags from these declarations (``declared``) and the config checks its values with
them (``field_problems``, ``partner_problems``), so a new setting is one edit.
Fields that share one ``Bound`` object are checked together and worded as one problem
(``{steps} and {batch} must be at least 1``); give each field its own ``Bound`` otherwise.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import SettingProblem, setting_problem


@dataclass(frozen=True, eq=False)
class Bound:
    """What a value must satisfy (``accepts``), worded as ``must be ...`` (``wording``)."""

    accepts: Callable[[Any], bool]
    wording: str


@dataclass(frozen=True)
class Option:
    """A setting's command-line form. ``parse``: text to value (None: the field's own type);
    ``repeatable``: each use appends; ``switch``: a flag without a value (True when given);
    ``needs``: the settings it does nothing without, each a field of the same config (set: not at
    its default) or a setting from outside it (``partner_problems``'s ``outside``)."""

    flag: str
    help: str
    metavar: Optional[str] = None
    parse: Optional[Callable[[str], Any]] = None
    repeatable: bool = False
    switch: bool = False
    bound: Optional[Bound] = None
    choices: Optional[Sequence[str]] = None
    needs: Tuple[str, ...] = ()


def option(default: Any, flag: str, help: str, **form: Any) -> Any:
    """A dataclass field with ``default`` (a new empty list per instance when ``repeatable``)
    and its ``Option``."""
    declared = Option(flag, help, **form)
    if declared.repeatable:
        return dataclasses.field(default_factory=list, metadata={"option": declared})
    return dataclasses.field(default=default, metadata={"option": declared})


def declared(cls: type) -> List[Tuple[dataclasses.Field, Option]]:
    """The fields of dataclass ``cls`` that have an ``Option``, in declaration order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata]


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one for a default factory)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def field_problems(config: Any) -> List[SettingProblem]:
    """What ``config``'s values say against their declared bounds and choices, by field name."""
    found: List[SettingProblem] = []
    grouped: Dict[Bound, List[str]] = {}
    for f, declared_option in declared(type(config)):
        value = getattr(config, f.name)
        if value is None:
            continue
        if declared_option.choices is not None and value not in declared_option.choices:
            found.append(setting_problem("{%s} must be one of {choices}, got {value!r}" % f.name,
                                         choices=", ".join(declared_option.choices), value=value))
        if declared_option.bound is not None:
            grouped.setdefault(declared_option.bound, []).append(f.name)
    for bound, names in grouped.items():
        values = [getattr(config, name) for name in names]
        if not all(bound.accepts(value) for value in values if value is not None):
            found.append(setting_problem(_joined(["{%s}" % name for name in names]) + " " + bound.wording
                                         + ", got " + _joined(["{v%d}" % i for i in range(len(names))]),
                                         **{f"v{i}": value for i, value in enumerate(values)}))
    return found


def partner_problems(config: Any, outside: Mapping[str, Tuple[bool, str]] = {}) -> List[SettingProblem]:  # noqa: B006
    """The settings of ``config`` given (not at their default) without a setting their
    declaration ``needs``: a field of ``config`` at its default, or a name of ``outside`` (a
    setting not of ``config``: whether it is on, and how to word it) that is off. One problem
    per missing setting, naming each setting that needs it, by field name."""
    fields = {f.name: f for f, _ in declared(type(config))}
    lacking: Dict[str, List[str]] = {}
    for name, f in fields.items():
        if getattr(config, name) == default_of(f):
            continue
        for partner in f.metadata["option"].needs:
            on = outside[partner][0] if partner in outside else getattr(config, partner) != default_of(fields[partner])
            if not on:
                lacking.setdefault(partner, []).append(name)
    return [setting_problem(_joined(["{%s}" % name for name in names]) + (" needs " if len(names) == 1 else " need ")
                            + (outside[partner][1] if partner in outside else "{%s}" % partner))
            for partner, names in lacking.items()]


def _joined(parts: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def parse_size(text: str) -> int:
    """``4K``, ``1M``, ``64MiB`` or a number of bytes."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(value[-1:], 1)
    return int(float(value[:-1] if scale > 1 else value) * scale)


def at_least(lowest: float) -> Bound:
    return Bound(lambda value: value >= lowest, f"must be at least {lowest:g}")


def positive_finite() -> Bound:
    return Bound(lambda value: 0 < value < math.inf, "must be positive and finite")


def probability() -> Bound:
    return Bound(lambda value: 0 < value <= 1, "must be in (0, 1]")


def non_negative_finite() -> Bound:
    return Bound(lambda value: 0 <= value < math.inf, "must be >= 0 and finite")
