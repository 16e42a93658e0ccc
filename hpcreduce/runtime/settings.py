"""Environment settings (``HPCREDUCE_*``): each declared once, parsed, and refused by name.

The module that reads a variable declares it as a ``Setting`` (name, parser, default,
what it must be). ``value()`` parses the variable when asked (the parse is cached per
text, so hot paths may ask on every call) and raises ``ConfigurationError`` naming the
variable, its value and what it must be: a bad setting is the same clear error as a bad
flag, never a traceback from deep inside. ``problems`` checks several at once; the CLI
checks every setting with its flags before it launches anything.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, List, Mapping, Optional, TypeVar

from ..errors import ConfigurationError

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """An environment variable: ``parse`` turns its text into a value or raises ValueError."""

    name: str
    parse: Callable[[str], T]
    default: T
    meaning: str

    def value(self, env: Optional[Mapping[str, str]] = None) -> T:
        """The variable's value (``default`` when unset or empty); ConfigurationError if unusable."""
        text = (os.environ if env is None else env).get(self.name, "").strip()
        if not text:
            return self.default
        try:
            return _parsed(self, text)
        except ValueError as err:
            reason = f" ({err})" if str(err) else ""
            raise ConfigurationError(f"{self.name}={text!r} is not {self.meaning}{reason}") from None

    def problem(self, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """Why the variable's value cannot be used, or None."""
        try:
            self.value(env)
        except ConfigurationError as err:
            return str(err)
        return None


@functools.lru_cache(maxsize=64)
def _parsed(setting: Setting, text: str):
    return setting.parse(text)


def problems(settings: Iterable[Setting], env: Optional[Mapping[str, str]] = None) -> List[str]:
    """What is wrong with each of ``settings`` in ``env`` (default: this process's)."""
    return [found for found in (setting.problem(env) for setting in settings) if found]


def positive_number(text: str) -> float:
    """A finite number above zero."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError("it must be above 0 and finite")
    return value


def positive_integer(text: str) -> int:
    """A whole number above zero."""
    value = int(text)
    if value <= 0:
        raise ValueError("it must be above 0")
    return value


def switch(text: str) -> bool:
    """on/off: 1, true, yes, on or 0, false, no, off (any case)."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("use 1/0, true/false, yes/no or on/off")


def non_negative_integer(text: str) -> int:
    """A whole number, zero or more."""
    value = int(text)
    if value < 0:
        raise ValueError("it must be 0 or more")
    return value


def text_value(text: str) -> str:
    """Any text."""
    return text
