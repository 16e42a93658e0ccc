"""The consistency models: when a server applies a push and when it may answer a read.

A worker's *clock* c is the number of steps it has finished (``clock()`` at the end
of each step); every request carries it. On a server, *slowest* is the smallest clock
among live workers (those that have not released the server).

- ``bsp``: a push of step t is buffered. When slowest passes t (every live worker
  finished step t), the server sums step t's gradients in worker order and applies ONE
  optimizer update (optimizer step t + 1), and only then answers reads of clock t + 1.
  A read at clock c waits until slowest >= c. This is synchronous SGD on the global batch.
- ``ssp`` with staleness s: every push is applied on arrival (one update each). A read
  at clock c waits until slowest >= c - s, so what it sees misses at most the updates of
  the last s clocks of any worker.
- ``asp``: every push is applied on arrival and no read waits (Downpour SGD); workers
  may also read every ``fetch_every`` steps and push every ``push_every`` steps.

Measured on every answered read: staleness = reader's clock - slowest (0 under BSP,
at most s under SSP). Measured on every applied push: update lag = updates the piece
received between the pusher's last read of it and this push.
"""
from __future__ import annotations

from typing import Optional

from ..errors import PSConfigError, setting_problem

KINDS = ("bsp", "ssp", "asp")


class Consistency:
    """One of BSP, SSP(staleness) and ASP (see the module docstring)."""

    def __init__(self, kind: str = "bsp", staleness: int = 0):
        if kind not in KINDS:
            raise PSConfigError(setting_problem("{consistency} must be one of {kinds}, got {value!r}",
                                                kinds=", ".join(KINDS), value=kind))
        if staleness < 0:
            raise PSConfigError(setting_problem("{staleness} must be >= 0, got {value}", value=staleness))
        if staleness and kind != "ssp":
            raise PSConfigError(setting_problem("{staleness} {value} only applies to ssp, not {kind}",
                                                value=staleness, kind=kind))
        self.kind = kind
        self.staleness = staleness
        self._bound = {"bsp": 0, "ssp": staleness, "asp": None}[kind]

    @property
    def aggregates(self) -> bool:
        """Whether pushes wait for their step to complete and are applied as one update."""
        return self.kind == "bsp"

    @property
    def bound(self) -> Optional[int]:
        """The most a read's staleness may be (None: unbounded)."""
        return self._bound

    def may_read(self, reader_clock: int, slowest: int) -> bool:
        """Whether a read at ``reader_clock`` may be answered now. Under BSP the server has
        applied every step below ``slowest`` before it asks."""
        bound = self._bound
        return bound is None or slowest >= reader_clock - bound

    def __repr__(self) -> str:
        return f"ssp(staleness={self.staleness})" if self.kind == "ssp" else self.kind
