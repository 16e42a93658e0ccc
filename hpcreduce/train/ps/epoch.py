"""One membership epoch of a fault-tolerant PS run: the whole state a change of ranks reads
and writes, as one value.

An ``Epoch`` holds this rank's view of the job between two changes of its ranks: the
communicator, the layout (who serves which shard, who works in which slot), the stable ids
(``Membership``), the next unused shard key, this rank's roles (the shards it holds, its
worker loop), how far growth and leaves are done, the node of every id, and the push records
of workers that left. Recovery, worker growth, server growth, leave and replacement are each
a function from an epoch (and what is asked) to the next one (``ps_recovery``, ``ps_growth``,
``scale_in``); only the driver installs one (``ps_driver.PSDriver.install``). The shards'
arrays and the worker loops inside are the running roles' own, changed as they run.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mpi4py import MPI

from ...ft.membership import Membership
from ...ps.holdings import ShardHoldings
from ...ps.layout import Layout
from ...ps.recovery_plan import Committed
from .worker_side import Takeover, WorkerSide

Departed = Tuple[int, int, int]  # (slot, pieces acknowledged, updates lost) of a worker that left


@dataclass(frozen=True)
class Epoch:
    """``resized_before``: growth and leaves due before steps up to it are done; ``nodes``:
    stable id -> node (for a discovery file of hosts); ``resume_mark``: the slowest worker's
    clock right after the last recovery (recovery events close once it moves past)."""

    comm: MPI.Intracomm
    layout: Layout
    members: Membership
    next_key: int
    holdings: ShardHoldings = field(default_factory=ShardHoldings)
    worker: WorkerSide = field(default_factory=WorkerSide)
    resized_before: int = 0
    nodes: Mapping[int, str] = field(default_factory=dict)
    departed: Tuple[Departed, ...] = ()
    resume_mark: int = 0

    @property
    def committed(self) -> Committed:
        """The layout and next key every rank agreed on, as the recovery plan reads them."""
        return Committed(self.layout, self.next_key)

    @property
    def server_ids(self) -> List[int]:
        """The stable ids of the servers, in rank order."""
        return [self.members.ids[rank] for rank in sorted(self.layout.shard_ranks.values())]

    def worker_ids(self, layout: Optional[Layout] = None) -> List[int]:
        """The stable ids of the workers of ``layout`` (this epoch's by default), by index."""
        return [self.members.ids[rank] for rank in (layout or self.layout).worker_ranks]

    def but(self, **changes: Any) -> "Epoch":
        """This epoch with ``changes``."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Welcome:
    """What the job sends the ranks it spawned, in one broadcast from rank 0: the membership
    (with the newcomers' ids), the layout before them (``Layout.wire``), the next shard key,
    how far growth is done and the clock the newcomers start at. Worker growth: ``seats``,
    the dead workers' seats the first newcomers take (by rank). Server growth: ``order``, the
    job's ranks in their new order (servers, then newcomers, then workers), ``server_keys``
    (the newcomers' shard keys), and the clocks and applied steps of rank 0's shard."""

    members: Dict[str, Any]
    layout: Dict[str, Any]
    next_key: int
    resized_before: int
    clock: int
    seats: Dict[int, Takeover] = field(default_factory=dict)
    order: Sequence[int] = ()
    server_keys: Sequence[int] = ()
    clocks: Any = None
    applied: int = 0

    @classmethod
    def of(cls, epoch: Epoch, clock: int, **extra: Any) -> "Welcome":
        return cls(epoch.members.control(), epoch.layout.wire(), epoch.next_key, epoch.resized_before, clock,
                   **extra)

    def layout_before(self, specs) -> Layout:
        return Layout.from_wire(specs, self.layout)
