"""Table-wise tables under fault tolerance: replicas on the ring successor, recovery in place (ULFM).

A table's *home* is a shard key (a rank's number at start, kept for life: ``tablewise.owners``);
its owner is the first live key from its home on, in the ring order of the keys at start
(``ps.layout.node_ring``). So when an owner dies its tables go to its ring successor, which
holds their replica: no table moves. A push's row gradients, once the owner summed them, go to
the successor too (``forward``: one more exchange round, the ids and summed rows, not the
pooled gradients and lookups again), and owner and replica apply them only after one
``Agree`` (exactly once: an interrupted push is applied nowhere; the survivors push the step
again over the new split of the batch, and a table refuses a step it already applied).
``rebuilt``: shrink to the survivors, promote the lost keys' replicas, copy every owner's
tables whole to its new successor (Python objects through ``sendrecv``: once per failure,
never per step), agree; in rounds until one commits. A key lost with its successor (two ring
neighbours) is a ``PSTrainingError`` on every survivor.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import PSTrainingError
from ...runtime.failures import abandon, release, restored_until_agreed, wait_all
from . import exchange
from .agreed_calls import AgreedCalls
from .exchange import HEAD
from .flat import offsets

Tables = Dict[int, Tuple[np.ndarray, Dict[str, np.ndarray], int]]  # table -> (rows, optimizer state, last step)
Update = Tuple[int, np.ndarray, np.ndarray]  # table, row ids, their summed gradients
FORWARD = zlib.crc32(b"forward") & 0x7FFFFFFF


def owner_keys(home: np.ndarray, ring: Sequence[int], live: Sequence[int]) -> np.ndarray:
    """Each table's owner: the first live key from its home key on, in ``ring`` order."""
    alive, position = set(live), {key: i for i, key in enumerate(ring)}

    def first_live(key: int) -> int:
        at = position[key]
        return next(ring[(at + i) % len(ring)] for i in range(len(ring)) if ring[(at + i) % len(ring)] in alive)
    return np.array([first_live(int(key)) for key in home], np.int64)


def neighbour(ring: Sequence[int], live: Sequence[int], key: int, step: int = 1) -> int:
    """The next live key after ``key`` in ``ring`` order (``step=-1``: the one before)."""
    alive = [k for k in ring if k in set(live)]
    return alive[(alive.index(key) + step) % len(alive)]


def forward(comm: MPI.Intracomm, step: int, successor: int, updates: List[Update], row_bytes: np.ndarray,
            dtypes: Sequence[np.dtype]) -> List[Update]:
    """Send the owner's summed row gradients to rank ``successor`` and receive every rank's
    sent here (the predecessor's), one exchange round; theirs, in table order."""
    count = len(row_bytes)
    headers = np.zeros((comm.Get_size(), HEAD + 2 * count), np.int64)
    headers[:, 1:3] = FORWARD, step
    sizes = np.zeros(count, np.int64)
    for t, rows, _ in updates:
        sizes[t] = len(rows)
    headers[successor, HEAD:HEAD + count] = sizes
    headers[successor, 3:5] = (sizes * 8).sum(), (sizes * row_bytes).sum()
    parts = [np.concatenate([rows.view(np.uint8) for _, rows, _ in updates] or [np.empty(0, np.uint8)]),
             np.concatenate([np.ascontiguousarray(g).reshape(-1).view(np.uint8) for _, _, g in updates]
                            or [np.empty(0, np.uint8)])]
    sends = exchange.post(comm, headers, parts)
    incoming, (ids, grads) = exchange.receive(comm, HEAD + 2 * count)
    wait_all(sends)
    counts = incoming[:, HEAD:HEAD + count].reshape(-1)
    id_at, grad_at = offsets(counts * 8), offsets(counts * np.tile(row_bytes, comm.Get_size()))
    out = []
    for k in np.flatnonzero(counts).tolist():
        t, n = k % count, int(counts[k])
        out.append((t, ids[id_at[k]:id_at[k] + 8 * n].view(np.int64),
                    grads[grad_at[k]:grad_at[k] + n * int(row_bytes[t])].view(dtypes[t]).reshape(n, -1)))
    return out


def replicate(comm: MPI.Intracomm, successor: int, predecessor: int, primaries: Tables) -> Tables:
    """Send ``primaries`` whole to rank ``successor``; the predecessor's (this rank's replicas)."""
    if comm.Get_size() < 2:
        return {}
    return comm.sendrecv(primaries, dest=successor, source=predecessor)


@dataclass
class Restored:
    """What one committed recovery installs."""

    comm: MPI.Intracomm
    live: Tuple[int, ...]
    primaries: Tables
    replicas: Tables
    lost: List[int]


def restore(comm: MPI.Intracomm, tables) -> Restored:
    """The survivors' new owners, primaries (the lost keys' replicas promoted) and replicas
    (every owner's tables copied to its new successor); nothing of ``tables`` is changed."""
    keys_and_clocks = comm.allgather((tables.key, tables.clock_value))
    if len({clock for _, clock in keys_and_clocks}) > 1:
        raise PSTrainingError(f"table-wise recovery: the survivors are at different steps {keys_and_clocks}")
    live = tuple(sorted(key for key, _ in keys_and_clocks))
    lost = sorted(set(tables.live) - set(live))
    old, new = owner_keys(tables.home, tables.ring, tables.live), owner_keys(tables.home, tables.ring, live)
    orphans = sorted({int(old[t]) for t in range(len(old))
                      if old[t] in lost and neighbour(tables.ring, tables.live, int(old[t])) in lost})
    if orphans:
        raise PSTrainingError(f"table-wise recovery: shard keys {orphans} were lost with their replicas "
                              "(a replica lives on the ring successor; two neighbours died)")
    primaries = {t: (tables.values[t], tables.state[t], tables.last_step[t]) if old[t] == tables.key else
                 (*tables.replicas[t], tables.replica_step[t]) for t in np.flatnonzero(new == tables.key).tolist()}
    rank_of = {key: rank for rank, key in enumerate(live)}
    replicas = replicate(comm, rank_of[neighbour(tables.ring, live, tables.key)],
                         rank_of[neighbour(tables.ring, live, tables.key, -1)], primaries)
    return Restored(comm, live, primaries, replicas, lost)


def rebuilt(tables) -> Restored:
    """Shrink, restore and commit, in rounds until a round commits."""
    return restored_until_agreed(tables.comm, lambda survivors: restore(survivors, tables))


class Recoverable(AgreedCalls):
    """``TableWiseTables``' fault-tolerance half: ``recover`` and the failure handling of its calls."""

    def recover(self) -> List[int]:
        """After a call raised a process failure (ULFM), on every survivor: the lost keys'
        tables promoted from their replicas, every owner's tables copied to its new successor
        (``tablewise_ft.rebuilt``); the lost shard keys. Then redo the step: pool again, push
        again (``rank`` and ``worker_count`` changed; a step already applied is refused)."""
        self._abandon()
        self.touch.make_all()  # tables travel whole
        return self._installed(rebuilt(self))

    def _replica_holder(self, key: int) -> Optional[int]:
        return neighbour(self.ring, self.live, key) if self._replicated else None

    def _restored_on(self, staying: MPI.Intracomm) -> List[int]:
        self.touch.make_all()  # tables travel whole
        return self._installed(restore(staying, self))

    def _installed(self, restored: Restored) -> List[int]:
        """Make a recovery's or a leave's restored tables this rank's; the keys lost."""
        release(self.comm)
        self.comm, self.live = restored.comm, restored.live
        self._locate()
        self.values = {t: rows for t, (rows, _, _) in restored.primaries.items()}
        self.state = {t: state for t, (_, state, _) in restored.primaries.items()}
        self.last_step = {t: step for t, (_, _, step) in restored.primaries.items()}
        self._install(restored.replicas)
        self._forward = None
        self.failure_agreed = False
        return restored.lost

    def _abandon(self) -> None:
        """Revoke the communicator and complete every request still in flight (with an error)."""
        handles = [h for h in self._pools if not h.done] + self._pushes
        abandon(self.comm, [h.request for h in self._pools if not h.done] +
                [r for push in self._pushes for r in push.requests])
        for handle in handles:
            handle.abandoned = True
        self._pools, self._pushes = [], []
