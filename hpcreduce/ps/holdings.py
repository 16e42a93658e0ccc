"""The shard states one server rank holds, through failures and rebalances.

A server holds its own shard (``own_key``) and, with two or more servers, the replica
of the shard before it in the replication ring (``Layout.neighbours``). During a
recovery it may hold more: a dead neighbour's shard adopted from the replica, a shard
rebuilt from a checkpoint, until the rebalance gives every shard of the new placement
to its new owner. A worker rank holds nothing (until it is promoted to server).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .shard_state import ShardState


@dataclass
class ShardHoldings:
    """``states`` by shard key; ``own_key``: the shard this rank serves; ``replica``:
    its copy of the predecessor's shard."""

    states: Dict[int, ShardState] = field(default_factory=dict)
    own_key: Optional[int] = None
    replica: Optional[ShardState] = None

    @property
    def own(self) -> Optional[ShardState]:
        """The state of the shard this rank serves (None on a worker)."""
        return self.states.get(self.own_key) if self.own_key is not None else None

    def everything(self) -> List[ShardState]:
        """Every state held, the replica last."""
        return list(self.states.values()) + ([self.replica] if self.replica is not None else [])

    def applied_steps(self) -> Dict[int, int]:
        """Shard key -> BSP steps applied, of every shard held as primary."""
        return {key: state.applied_steps for key, state in self.states.items()}

    def replica_applied(self) -> Optional[Tuple[int, int]]:
        """(shard key, BSP steps applied) of the replica, if one is held."""
        return (self.replica.shard, self.replica.applied_steps) if self.replica is not None else None

    def adopt_replica(self) -> None:
        """Serve the replica as a primary shard (its primary died)."""
        self.states[self.replica.shard], self.replica = self.replica, None

    def settle(self, own_key: Optional[int], state: Optional[ShardState], replica: Optional[ShardState]) -> None:
        """After a recovery: hold exactly ``state`` (as ``own_key``) and ``replica``."""
        self.own_key = own_key
        self.states = {own_key: state} if state is not None else {}
        self.replica = replica
