"""The shard states one server rank holds, through failures and rebalances.

A server holds its own shard (``own_key``) and, with two or more servers, the replica
of the shard before it in the replication ring (``Layout.neighbours``). During a
recovery it may hold more: a dead neighbour's shard adopted from the replica, a shard
rebuilt from a checkpoint, until the rebalance gives every shard of the new placement
to its new owner. A worker rank holds nothing (until it is promoted to server).
A value: every change gives new holdings (the states themselves are the servers' own).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Tuple

from .shard_state import ShardState


@dataclass(frozen=True)
class ShardHoldings:
    """``states`` by shard key; ``own_key``: the shard this rank serves; ``replica``:
    its copy of the predecessor's shard."""

    states: Mapping[int, ShardState] = field(default_factory=dict)
    own_key: Optional[int] = None
    replica: Optional[ShardState] = None

    @classmethod
    def serving(cls, own_key: Optional[int], state: Optional[ShardState],
                replica: Optional[ShardState] = None) -> "ShardHoldings":
        """Exactly ``state`` (as ``own_key``; none when None) and ``replica``."""
        return cls({own_key: state} if state is not None else {}, own_key, replica)

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

    def with_replica_adopted(self) -> "ShardHoldings":
        """The replica served as a primary shard (its primary died)."""
        return replace(self, states={**self.states, self.replica.shard: self.replica}, replica=None)

    def with_states(self, states: Mapping[int, ShardState]) -> "ShardHoldings":
        """These holdings and ``states`` besides (or instead of those of the same keys)."""
        return replace(self, states={**self.states, **states})
