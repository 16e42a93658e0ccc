"""What a committed recovery round leads to, as one function from epoch to epoch: the round's
leavers gone (``scale_in``), the survivors settled (``ps_recovery.settle``), then the growth,
server growth and replacements its plan asks for (``ps_growth``), in that order.

Each step is collective over the ranks of that moment and gives the next epoch; the events
each one makes are returned for the driver's log. Rank 0 keeps the events: when it leaves it
hands them on first, so the log itself may come back replaced.
"""
from __future__ import annotations

from typing import List, Tuple

from ...ft.events import RecoveryEvent
from ...runtime.context import Context
from . import ps_growth, scale_in
from .epoch import Epoch
from .ps_setup import PSSetup
from .ps_recovery import PSRecoveryEvent, Settled, settle
from .worker_side import dead_seats


def carry_out(ctx: Context, setup: PSSetup, before: Epoch, settled: Settled, event: PSRecoveryEvent,
              requested: float, events: List[RecoveryEvent]) -> Tuple[Epoch, List[RecoveryEvent]]:
    """The epoch after round ``settled`` of a recovery from epoch ``before`` and everything its
    plan asks for, and the event log with this recovery's events added (``requested``: when
    rank 0 asked for the change, for the events of membership changes)."""
    plan = settled.plan
    seats = dead_seats(before.layout, plan) if setup.fault.replace else []
    layout = settled.layout
    if plan.leaving:
        settled, layout, events = scale_in.leave(ctx, settled, event, requested, events)
    epoch = settle(ctx, settled, layout)
    events = events + ([event] if event.lost or event.left else [])
    clock = plan.restart if plan.restart is not None else min(plan.clocks.values())
    count, step = plan.growth
    if count:
        epoch, grown = ps_growth.grow_workers(ctx, setup, epoch, count, "growth", clock, plan.resume_step, step)
        events.append(grown)
    servers, step = plan.server_growth
    if servers:
        epoch, grown = ps_growth.grow_servers(ctx, setup, epoch, servers, step, requested)
        events.append(grown)
    if setup.fault.replace and event.lost:
        epoch, grown = ps_growth.grow_workers(ctx, setup, epoch, len(event.lost), "replacement", clock,
                                              plan.resume_step, 0, seats)
        events.append(grown)
    return epoch, events
