"""Environment settings (``HPCREDUCE_*``): each declared once, parsed, and refused by name.

The module that reads a variable declares it as a ``Setting`` (name, parser, default,
what it must be). ``value()`` reads and parses the variable the first time it is asked and
keeps the result for the process (hot paths, such as a small allreduce, ask on every call:
a dictionary lookup); ``reload()`` forgets what was read, for code that changes
``os.environ`` while it runs. An unusable value raises ``ConfigurationError`` naming the
variable, its value and what it must be: a bad setting is the same clear error as a bad
flag, never a traceback from deep inside. ``problems`` checks several at once; the CLI
checks every setting with its flags before it launches anything.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, Iterable, List, Mapping, Optional, Tuple, TypeVar

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
        """The variable's value (``default`` when unset or empty) in ``env``, or in this
        process's environment as first read; ConfigurationError if unusable."""
        if env is not None:
            found = self._read(env)
        else:
            found = _READ.get(self.name)
            if found is None:
                found = _READ[self.name] = self._read(os.environ)
        value, problem = found
        if problem is not None:
            raise ConfigurationError(problem)
        return value

    def _read(self, env: Mapping[str, str]) -> Tuple[Any, Optional[str]]:
        """(value, None), or (None, why it cannot be used)."""
        text = env.get(self.name, "").strip()
        if not text:
            return self.default, None
        try:
            return self.parse(text), None
        except ValueError as err:
            reason = f" ({err})" if str(err) else ""
            return None, f"{self.name}={text!r} is not {self.meaning}{reason}"

    def is_set(self) -> bool:
        """Whether this process's environment gives the variable a value (not the default)."""
        return bool(os.environ.get(self.name, "").strip())

    def problem(self, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """Why the variable's value cannot be used, or None."""
        try:
            self.value(env)
        except ConfigurationError as err:
            return str(err)
        return None


_READ: Dict[str, Tuple[Any, Optional[str]]] = {}
"""What each variable of this process's environment was read as: name -> (value, problem)."""


_GENERATION = [0]
"""How many times ``reload`` ran: what a cache of settings' values compares (``generation``)."""


def reload() -> None:
    """Forget what was read: the next ``value()`` reads ``os.environ`` again."""
    _READ.clear()
    _GENERATION[0] += 1


def generation() -> int:
    """Changes whenever ``reload`` forgets what was read: a cache built from settings' values
    (the planned path of ``allreduce``) is still right while this stays the same."""
    return _GENERATION[0]


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
