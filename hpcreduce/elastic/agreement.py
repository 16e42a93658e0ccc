"""``agreed``: a block committed by one agreement before anyone acts on it.

A ring step's compute and reduce run in one ``ft.rounds.attempt``: only when every rank
finished it does any rank apply it, so an interrupted step is redone by every survivor and
none is applied twice. When the attempt does not commit, every rank raises ``Interrupted``
at once and ``run`` recovers. Without ULFM the block runs under the deadline watchdog.
Cost: one ``MPI_Comm_agree`` per block.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from ..ft.rounds import attempt
from ..ft.watchdog import watchdog
from ..runtime.context import Context

T = TypeVar("T")


class Interrupted(Exception):
    """Raised on every rank at once by ``agreed`` when a rank failed in its block; ``run``
    recovers. ``detected_at``: when this rank saw the failure, or learned of it."""

    def __init__(self, what: str, detected_at: float):
        super().__init__(f"{what}: a rank failed")
        self.detected_at = detected_at


def agreed(ctx: Context, work: Callable[[], T], what: str) -> T:
    """``work()``'s result once every rank has done it; ``Interrupted`` on every rank if a rank
    failed. Without ULFM, ``work()`` under the deadline watchdog."""
    if not ctx.ft:
        with watchdog.guard(what):
            return work()
    outcome = attempt(ctx.comm, work, what)
    if not outcome.committed:
        raise Interrupted(what, outcome.failed_at or time.time())
    return outcome.result
