"""Flags made from a config's field declarations (``runtime.options``), and read back.

``add_flags(group, cls)`` adds one flag per declared field of dataclass ``cls``: its dest is
the field's name, its default absent (``argparse.SUPPRESS``), so ``given(args, cls)`` returns
exactly what the command line set, parsed (problems named by flag). The help shows the
field's default unless the declaration words it itself.
"""
from __future__ import annotations

import argparse
import typing
from typing import Any, Callable, Dict, List, Tuple

from ..runtime.options import declared, default_of


def add_flags(group: Any, cls: type, skip: Tuple[str, ...] = ()) -> None:
    """One flag per declared field of ``cls`` (those whose flag is in ``skip`` left out)."""
    types = typing.get_type_hints(cls)
    for f, option in declared(cls):
        if option.flag in skip:
            continue
        settings: Dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                                    "help": option.help + _default_text(option.help, default_of(f))}
        if option.switch:
            settings["action"] = "store_true"
        else:
            settings["metavar"] = option.metavar
            settings["type"] = str if option.parse else _scalar(types[f.name])
            if option.repeatable:
                settings["action"] = "append"
        group.add_argument(option.flag, **settings)


def given(args: argparse.Namespace, cls: type) -> Tuple[Dict[str, Any], List[str]]:
    """The fields of ``cls`` the command line set, parsed, and the flags that do not parse."""
    values: Dict[str, Any] = {}
    problems: List[str] = []
    for f, option in declared(cls):
        if not hasattr(args, f.name):
            continue
        raw = getattr(args, f.name)
        if option.parse is None or option.switch:
            values[f.name] = raw
            continue
        parsed = []
        for text in raw if option.repeatable else [raw]:
            try:
                parsed.append(option.parse(text))
            except ValueError as err:
                problems.append(f"{option.flag} {err}")
        if option.repeatable or parsed:  # a repeated flag keeps the uses that parse
            values[f.name] = parsed if option.repeatable else parsed[0]
    return values, problems


def _scalar(annotation: Any) -> Callable[[str], Any]:
    """How a field's text is read: as an integer (``int64``), a float or a string (``Optional[X]``
    reads as X)."""
    options = [kind for kind in typing.get_args(annotation) if kind is not type(None)] or [annotation]
    return int64 if options[0] is int else float if options[0] is float else str


def int64(text: str) -> int:
    """An integer flag's value, bounded where it is parsed: within int64, which every count,
    step and seed of a run is held in (a larger one failed deep inside the run)."""
    value = int(text)
    if not -(1 << 63) <= value < 1 << 63:
        raise argparse.ArgumentTypeError(f"{text} is past the 64-bit integers a run counts in "
                                         f"(at most {(1 << 63) - 1})")
    return value


def _default_text(help_text: str, default: Any) -> str:
    if "default" in help_text or default is None or default is False or default in ([], ""):
        return ""
    return f" (default {default})"
