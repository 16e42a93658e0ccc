"""Who is who in a PS job: server ranks, worker ranks, and where each table lives.

With K servers on N ranks, ranks 0..K-1 are the servers (shard key k on rank k at
start) and ranks K..N-1 the workers. A worker is named by its *slot*, a stable number
(rank - K at start; a worker that joins later gets the next unused one, and a slot
is never reused), which indexes the servers' per-slot counters; its *index* is its
position among the live workers, which picks its share of each batch. After a failure
recovery builds a new layout with ``rebuilt``: the surviving shard keys, their new
ranks, the live workers and a recomputed placement; workers re-route by it.
Shard keys also form the replication ring: each shard's backup is the server of the
next key in the ring (``neighbours``). When the servers span nodes the ring alternates
nodes (``node_ring``), so a shard and its replica are on different nodes and losing a
node never takes both (guaranteed while no node holds more than half the servers; else as
few shards as a ring allows back up on their own node). The layout remembers each key's
node (``key_nodes``) and recomputes the ring whenever the keys change (recovery, growth),
the same on every rank; on one node, or with a key whose node is unknown, the ring is the
old one (sorted keys; survivors keep their order, new keys are appended).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import PSConfigError, SettingProblem, setting_problem
from .placement import Placement, place
from .tables import ParamSpec


def servers_problem(servers: int, size: int) -> Optional[SettingProblem]:
    """Why ``servers`` servers cannot run on ``size`` ranks (None when they can)."""
    if not 1 <= servers < size:
        return setting_problem("{servers} K needs 1 <= K < ranks ({size}), got {value} "
                               "(at least one server and one worker)", size=size, value=servers)
    return None


def node_ring(keys: Sequence[int], nodes: Mapping[int, str]) -> List[int]:
    """``keys`` in a ring order where neighbours lie on different ``nodes[key]`` whenever
    no node has more than half the keys (else only the fewest pairs a ring allows, 2m - K
    for m of K keys on one node): grouped by node (largest group first), the groups fill the
    even positions, then the odd ones; sorted keys on one node. The same on every rank, and
    the same under a renaming of the nodes or an order-preserving renumbering of the keys."""
    if len({nodes[key] for key in keys}) < 2:
        return sorted(keys)
    groups: Dict[str, List[int]] = {}
    for key in sorted(keys):
        groups.setdefault(nodes[key], []).append(key)
    ordered = [k for group in sorted(groups.values(), key=lambda g: (-len(g), g[0])) for k in group]
    ring = [0] * len(ordered)
    positions = list(range(0, len(ordered), 2)) + list(range(1, len(ordered), 2))
    for position, key in zip(positions, ordered):
        ring[position] = key
    return ring


class Layout:
    """Roles and placement shared by every rank of one PS job.

    ``worker_slots[i]`` is the slot of the worker on ``worker_ranks[i]`` (default: i);
    ``slot_count`` is the number of slots ever handed out (the length of per-slot arrays);
    ``ring`` the replication ring's key order (default: sorted keys; keys gone are dropped);
    ``key_nodes`` the node of each shard key's server: when it names every key, the ring is
    ``node_ring`` of them instead.
    """

    def __init__(self, specs: Sequence[ParamSpec], shard_ranks: Mapping[int, int],
                 worker_ranks: Sequence[int], worker_slots: Optional[Sequence[int]] = None,
                 slot_count: Optional[int] = None, ring: Optional[Sequence[int]] = None,
                 key_nodes: Optional[Mapping[int, str]] = None):
        self.specs: Tuple[ParamSpec, ...] = tuple(specs)
        self.shard_ranks: Dict[int, int] = dict(shard_ranks)
        self.worker_ranks: Tuple[int, ...] = tuple(worker_ranks)
        self.worker_slots: Tuple[int, ...] = tuple(range(len(self.worker_ranks)) if worker_slots is None
                                                   else worker_slots)
        if len(self.worker_slots) != len(self.worker_ranks):
            raise ValueError("one slot per worker rank")
        self.slot_count = max(self.worker_slots, default=-1) + 1 if slot_count is None else slot_count
        self.placement: Placement = place(self.specs, sorted(self.shard_ranks))
        self.table_ids: Dict[str, int] = {spec.name: t for t, spec in enumerate(self.specs)}
        self._shard_of_rank = {rank: key for key, rank in self.shard_ranks.items()}
        self._slot_of_rank = dict(zip(self.worker_ranks, self.worker_slots))
        self._index_of_rank = {rank: i for i, rank in enumerate(self.worker_ranks)}
        self.key_nodes: Dict[int, str] = {k: n for k, n in (key_nodes or {}).items() if k in self.shard_ranks}
        if len(self.key_nodes) == len(self.shard_ranks):
            ring = node_ring(list(self.shard_ranks), self.key_nodes)
        ordered = [k for k in (ring or ()) if k in self.shard_ranks]
        self.ring: Tuple[int, ...] = tuple(ordered + sorted(set(self.shard_ranks) - set(ordered)))

    @classmethod
    def initial(cls, specs: Sequence[ParamSpec], size: int, servers: int,
                nodes: Optional[Sequence[str]] = None) -> "Layout":
        """K servers on ranks 0..K-1, workers on the rest; raises PSConfigError otherwise.
        ``nodes``: the node of every rank, for a replication ring across nodes."""
        problem = servers_problem(servers, size)
        if problem:
            raise PSConfigError(problem)
        key_nodes = {k: nodes[k] for k in range(servers)} if nodes else None
        return cls(specs, {k: k for k in range(servers)}, range(servers, size), key_nodes=key_nodes)

    def rebuilt(self, shard_ranks: Mapping[int, int], worker_ranks: Sequence[int],
                worker_slots: Optional[Sequence[int]] = None,
                slot_count: Optional[int] = None, nodes: Optional[Mapping[int, str]] = None) -> "Layout":
        """The layout over other shards and ranks (after a failure); placement and ring
        recomputed (``nodes``: the node of new keys, {key: node}; surviving keys keep theirs)."""
        return Layout(self.specs, shard_ranks, worker_ranks, worker_slots, slot_count, self.ring,
                      {**self.key_nodes, **(nodes or {})})

    def renumbered(self, new_rank: Mapping[int, int]) -> "Layout":
        """The same roles after the ranks were renumbered (``new_rank[old rank]``); slots, ring
        and nodes kept."""
        return self.rebuilt({key: new_rank[rank] for key, rank in self.shard_ranks.items()},
                            [new_rank[rank] for rank in self.worker_ranks], self.worker_slots, self.slot_count)

    @classmethod
    def with_servers(cls, specs: Sequence[ParamSpec], before: Mapping[str, Any], order: Sequence[int],
                     keys: Sequence[int]) -> "Layout":
        """The layout ``before`` (``wire``) with shard keys ``keys`` served by newcomers, once the
        ranks are in ``order`` (servers, newcomers, workers): the same on the job's ranks and on
        the newcomers, who know only the wire form."""
        new_rank = {rank: position for position, rank in enumerate(order)}
        servers = {key: new_rank[rank] for key, rank in before["shard_ranks"].items()}
        servers.update({key: len(before["shard_ranks"]) + i for i, key in enumerate(keys)})
        return cls.from_wire(specs, {**before, "shard_ranks": servers,
                                     "worker_ranks": [new_rank[rank] for rank in before["worker_ranks"]]})

    def wire(self) -> Dict[str, Any]:
        """This layout as plain values, for ``from_wire`` on a rank that joins (the tables aside:
        every rank knows them)."""
        return {"shard_ranks": dict(self.shard_ranks), "worker_ranks": list(self.worker_ranks),
                "worker_slots": list(self.worker_slots), "slot_count": self.slot_count, "ring": list(self.ring),
                "key_nodes": dict(self.key_nodes)}

    @classmethod
    def from_wire(cls, specs: Sequence[ParamSpec], wire: Mapping[str, Any]) -> "Layout":
        """The layout ``wire()`` gave, over the tables ``specs``."""
        return cls(specs, wire["shard_ranks"], wire["worker_ranks"], wire["worker_slots"], wire["slot_count"],
                   wire["ring"], wire["key_nodes"])

    @property
    def worker_count(self) -> int:
        """Live workers: the number the global batch is split over."""
        return len(self.worker_ranks)

    def is_server(self, rank: int) -> bool:
        return rank in self._shard_of_rank

    def shard_of(self, rank: int) -> int:
        return self._shard_of_rank[rank]

    def slot_of(self, rank: int) -> int:
        """The worker slot of ``rank``, or -1 if it is not a worker."""
        return self._slot_of_rank.get(rank, -1)

    def worker_index(self, rank: int) -> int:
        """The position of ``rank`` among the live workers (its share of a batch), or -1."""
        return self._index_of_rank.get(rank, -1)

    def neighbours(self, key: int) -> Tuple[int, int]:
        """(next key, previous key) of shard ``key`` in the replication ring: the shard whose
        server keeps ``key``'s replica, and the shard whose replica ``key``'s server keeps."""
        keys = self.ring
        position = keys.index(key)
        return keys[(position + 1) % len(keys)], keys[position - 1]

    def same_node_backups(self) -> List[int]:
        """Shard keys whose backup is on their own node although the servers span several
        (a node holds more than half of them): a loss of that node takes shard and replica."""
        if len(self.ring) < 2 or len(set(self.key_nodes.values())) < 2:
            return []
        return sorted(key for key in self.ring
                      if self.key_nodes.get(key) == self.key_nodes.get(self.neighbours(key)[0]))

    def homes(self, nodes: Sequence[str], replicated: bool) -> List[Dict[str, Any]]:
        """Where each shard lives: its primary's rank and node (``nodes``: by rank) and, when
        ``replicated`` with K > 1, its replica's (the server of the next key in the ring); else None."""
        found = []
        for key in sorted(self.shard_ranks):
            rank = self.shard_ranks[key]
            backup = self.shard_ranks[self.neighbours(key)[0]] if replicated and len(self.ring) > 1 else None
            found.append({"shard": key, "rank": rank, "node": nodes[rank], "replica_rank": backup,
                          "replica_node": None if backup is None else nodes[backup]})
        return found
