"""Where rows live in the colocated layout: every trainer rank holds one shard key.

Rows go to shard keys by the parameter servers' own rendezvous hashing
(``ps.placement``) over the live keys: a key is a rank's number when the job started and is
kept for life, so after a rank dies only its rows move (each to the survivor that scored next
highest), never a survivor's. Each key's replica is held by the next key in the ring
(``ps.layout.node_ring``: neighbours on different nodes when the ranks span nodes, else keys
in order), as the servers' replicas are.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from ..layout import node_ring
from ..placement import Placement, place
from ..tables import ParamSpec


class ColocatedLayout:
    """``keys[r]``: the shard key of rank r; ``nodes[r]``: its node."""

    def __init__(self, specs: Sequence[ParamSpec], keys: Sequence[int], nodes: Sequence[str]):
        self.specs: Tuple[ParamSpec, ...] = tuple(specs)
        self.keys: Tuple[int, ...] = tuple(int(k) for k in keys)
        self.nodes: Tuple[str, ...] = tuple(nodes)
        self.placement: Placement = place(self.specs, sorted(self.keys))
        self.table_ids: Dict[str, int] = {spec.name: t for t, spec in enumerate(self.specs)}
        self.ring: Tuple[int, ...] = tuple(node_ring(self.keys, dict(zip(self.keys, self.nodes))))
        self._rank = np.full(max(self.keys) + 1, -1, dtype=np.int64)
        self._rank[list(self.keys)] = np.arange(len(self.keys))
        position = {key: i for i, key in enumerate(self.ring)}
        self.successor = {key: self.ring[(position[key] + 1) % len(self.ring)] for key in self.keys}
        self.predecessor = {after: key for key, after in self.successor.items()}
        self._replica_rank = np.full(max(self.keys) + 1, -1, dtype=np.int64)
        for key, after in self.successor.items():
            self._replica_rank[key] = self._rank[after]

    def owner_ranks(self, table: int, ids: np.ndarray) -> np.ndarray:
        """The rank holding each of ``ids`` of table ``table``."""
        return self._rank[self.placement.row_owners(table, ids)]

    def replica_ranks(self, owners: np.ndarray) -> np.ndarray:
        """The rank holding the replica of the rows whose owners are ranks ``owners``."""
        return self._replica_rank[np.asarray(self.keys, np.int64)[owners]]

    def rank_of(self, key: int) -> int:
        return int(self._rank[key])
