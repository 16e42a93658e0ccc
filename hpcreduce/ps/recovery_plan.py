"""What a parameter-server recovery does, decided identically on every survivor.

Every survivor reports what it holds (``Report``: shard states and their applied BSP
steps, the replica it keeps, its worker slot and clock, whether a push of its is in
flight); the reports are gathered to everyone, and ``make_plan`` turns them, with the
last committed layout, into the same ``Plan`` on every rank: which live server takes
over each shard (its own, the replica it holds of a dead neighbour, or a checkpoint
when shard and replica both died), who is promoted to server when none is left, the
step BSP restarts from, the workers' clocks, and the next layout. Ranks that leave
(``Report.leaving``, named by rank 0) are planned out like dead ones, but alive: the
shards they hold move from them, and their unacknowledged pushes are re-pushed. It is a pure
function, so a recovery interrupted by another failure is simply planned again.
Cost: O(ranks + shards), no communication (the reports come from one allgather).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import SettingProblem, setting_problem
from .layout import Layout


@dataclass
class Report:
    """One survivor's account (pickled; a few hundred bytes)."""

    member: int
    own_key: Optional[int] = None
    active: Dict[int, int] = field(default_factory=dict)     # shard key -> applied BSP steps
    replica: Optional[Tuple[int, int]] = None                # (shard key, applied BSP steps)
    slot: Optional[int] = None
    clock: int = 0
    outgoing: bool = False
    detected_at: Optional[float] = None
    growth: Tuple[int, int] = (0, 0)                         # (newcomers wanted, before step)
    checkpoint: Optional[int] = None
    server_growth: Tuple[int, int] = (0, 0)                  # (servers wanted, before step)
    leaving: Tuple[Tuple[int, ...], int] = ((), 0)           # (ids that leave, before step)


@dataclass
class Committed:
    """What every rank agreed on at the last commit: the layout and the next unused shard key."""

    layout: Layout
    next_key: int


@dataclass
class Plan:
    """The recovery every survivor carries out (see the module docstring)."""

    server_ranks: List[int]
    own_keys: Dict[int, int]                 # server rank -> its key in the new layout
    holders: Dict[int, int]                  # committed shard key -> rank holding its state now
    adopted: List[int]                       # keys taken over from a replica
    restored: List[int]                      # keys rebuilt from a checkpoint (held by rank 0)
    checkpoint: Optional[int]
    promoted: Optional[int]                  # rank of a worker turned server
    live_workers: List[Tuple[int, int]]      # (rank, slot) of the live workers
    clocks: Dict[int, int]                   # slot -> clock after the recovery
    restart: Optional[int]                   # BSP: the step everybody restarts from
    step: int                                # the step the most advanced worker is on (from 1)
    detected_at: float
    growth: Tuple[int, int]
    next_key: int
    fatal: Optional[SettingProblem] = None
    server_growth: Tuple[int, int] = (0, 0)
    leaving: List[int] = field(default_factory=list)    # ranks that leave (alive: they hand over first)
    left: Tuple[Tuple[int, ...], int] = ((), 0)          # (their ids, before step)

    @property
    def resume_step(self) -> int:
        """The step (from 1) the slowest worker is on after the recovery."""
        return (self.restart if self.restart is not None else min(self.clocks.values(), default=0)) + 1

    @property
    def rollback(self) -> bool:
        """BSP with a shard rebuilt from a checkpoint: every shard goes back to it."""
        return self.restart is not None and bool(self.restored)

    def layout(self, committed: Layout) -> Layout:
        """The layout after the recovery (before any growth)."""
        return committed.rebuilt({key: rank for rank, key in self.own_keys.items()},
                                 [rank for rank, _ in self.live_workers], [slot for _, slot in self.live_workers],
                                 committed.slot_count)


def make_plan(reports: List[Report], committed: Committed, bsp: bool, now: float) -> Plan:
    """The plan for these reports (``reports[r]`` from the rank that is now ``r``)."""
    left = next((report.leaving for report in reports if report.leaving[0]), ((), 0))
    leaving = [rank for rank, report in enumerate(reports) if report.member in left[0]]
    servers = [rank for rank, report in enumerate(reports) if report.own_key is not None and rank not in leaving]
    live_workers = [(rank, report.slot) for rank, report in enumerate(reports)
                    if report.slot is not None and rank not in leaving]
    holders = {key: rank for rank, report in enumerate(reports) for key in report.active}
    lost = [key for key in sorted(committed.layout.shard_ranks) if key not in holders]
    adopted = []
    for key in lost:
        keeper = [rank for rank, report in enumerate(reports) if report.replica and report.replica[0] == key]
        if keeper:
            holders[key] = keeper[0]
            adopted.append(key)
    restored = [key for key in lost if key not in holders]
    checkpoint = reports[0].checkpoint
    own_keys = {rank: reports[rank].own_key for rank in servers}
    promoted, next_key = None, committed.next_key
    if not servers and live_workers:
        promoted = live_workers.pop(0)[0]
        own_keys, servers, next_key = {promoted: next_key}, [promoted], next_key + 1
    for key in restored:
        holders[key] = servers[0] if servers else 0
    clocks = {report.slot: report.clock for rank, report in enumerate(reports)
              if report.slot is not None and rank not in leaving}
    restart = None
    if bsp:
        applied = [steps for report in reports for steps in report.active.values()]
        applied += [report.replica[1] for report in reports if report.replica and report.replica[0] in adopted]
        restart = checkpoint if restored and checkpoint is not None else max(applied, default=0)
        clocks = {slot: restart for _, slot in live_workers}
    detected = [report.detected_at for report in reports if report.detected_at is not None]
    plan = Plan(servers, own_keys, holders, adopted, restored, checkpoint, promoted, live_workers, clocks,
                restart, max(report.clock for report in reports) + 1 if live_workers else 1,
                min(detected, default=now), max(report.growth for report in reports), next_key)
    plan.server_growth = max(report.server_growth for report in reports)
    plan.leaving, plan.left = leaving, left
    plan.fatal = _fatal(plan)
    return plan


def _fatal(plan: Plan) -> Optional[SettingProblem]:
    """Why the job cannot go on, or None."""
    if not plan.live_workers:
        return setting_problem("every worker is gone: nobody is left to train")
    if plan.restored and plan.checkpoint is None:
        return setting_problem("parameter-server shard(s) {restored} died together with their replica "
                               "(K=1 keeps none; with K >= 2 two neighbouring servers died) and there is no "
                               "complete checkpoint to restore them from: give {checkpoint_dir} and "
                               "{checkpoint_every} (and {servers} >= 2 for replicas)", restored=plan.restored)
    return None
