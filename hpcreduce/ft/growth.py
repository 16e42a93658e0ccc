"""When a running job grows: one rule for both topologies.

Growth is asked for by ``--grow N@STEP`` entries (N more ranks before step STEP) and by
a discovery file holding the wanted number of ranks, read every ``discover_every``
steps. ``GrowthRule.count(after, step, size, target)`` is how many ranks to add before
``step`` when growth up to step ``after`` is done: the entries due in (after, step],
raised to reach the discovery file's target when that asks for more. The spawn and
merge themselves are ``hpcreduce.runtime.spawn``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple


@dataclass(frozen=True)
class GrowthRule:
    """``grow``: (count, step) entries; ``discover``: the discovery file, read at steps
    that are multiples of ``discover_every``."""

    grow: Sequence[Tuple[int, int]] = ()
    discover: Optional[str] = None
    discover_every: int = 1

    def reads_target(self, step: int) -> bool:
        """Whether the discovery file is read before ``step``."""
        return bool(self.discover) and step % self.discover_every == 0

    def count(self, after: int, step: int, size: int, target: Optional[int] = None) -> int:
        """Ranks to add to a job of ``size`` ranks before ``step``, growth before step
        ``after`` being done; ``target``: the discovery file's number, if read."""
        count = sum(n for n, at in self.grow if after < at <= step)
        if target is not None and target > size + count:
            count = target - size
        return count

    def target(self, step: int) -> Optional[int]:
        """The discovery file's number when it is read before ``step`` (None otherwise)."""
        return read_target(self.discover) if self.reads_target(step) else None


def parse_grow(text: str) -> Tuple[int, int]:
    """``N@STEP``: (N, STEP), add N ranks before step STEP."""
    try:
        count, step = (int(part) for part in text.split("@"))
    except ValueError:
        raise ValueError(f"{text!r}: expected N@STEP, e.g. 2@50") from None
    if count < 1 or step < 0:
        raise ValueError(f"{text!r}: N must be >= 1 and STEP >= 0")
    return count, step


def read_target(path: str) -> Optional[int]:
    """The number of ranks a discovery file asks for, or None if it is absent or unreadable
    (a file being rewritten is read again at the next poll)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
