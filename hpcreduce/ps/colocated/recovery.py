"""A trainer rank SIGKILLed under the colocated layout: survivors rebuild its shard in place (ULFM).

After a call raised a process failure, every survivor calls ``ColocatedTables.recover()``:

1. the communicator is revoked, shrunk to the survivors and agreed (``runtime.failures.shrink_agreed``,
   the loop ``ft.rounds`` uses too); survivors keep their order and shard keys;
2. each lost key's rows come from its replica, held by the key's ring successor (a key lost
   with its replica is a ``PSTrainingError`` on every rank); the placement is recomputed over
   the live keys (rendezvous hashing: only the lost rows move) and each replicated row goes to
   its new owner, with its optimizer state;
3. every shard is copied whole to its new ring successor, the new replica;
4. one ``Agree`` commits: only then are the new stores installed, so a failure during the
   restore starts the round again from what each survivor held before.

Pushes are exactly once: a push is applied only after every rank agreed that every rank
received it (``ColocatedTables._commit``), so an interrupted step was applied nowhere and
is pushed again by the survivors over the new split of the batch; the step travels with it,
and a shard refuses a step it already applied. Cost: one shrink, one ``alltoall`` of the
lost rows, one shard to each successor, one agreement (``moves``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import List, Optional

from mpi4py import MPI

from ...errors import PSTrainingError
from ...runtime.failures import restored_until_agreed
from ...runtime.nodes import rank_nodes
from .layout import ColocatedLayout
from .moves import deliver, replicate
from .store import ShardStore


@dataclass
class Restored:
    """What one committed recovery installs."""

    comm: MPI.Intracomm
    layout: ColocatedLayout
    store: ShardStore
    replica: Optional[ShardStore]
    lost: List[int]


def restore(comm: MPI.Intracomm, layout: ColocatedLayout, key: int, store: ShardStore,
            replica: Optional[ShardStore], clock: int) -> Restored:
    """Steps 2-3 of the module docstring on the survivors' ``comm``: nothing given is changed."""
    keys_and_clocks = comm.allgather((key, clock))
    keys = [k for k, _ in keys_and_clocks]
    if len({c for _, c in keys_and_clocks}) > 1:
        raise PSTrainingError(f"colocated recovery: the survivors are at different steps {keys_and_clocks}")
    lost = sorted(set(layout.keys) - set(keys))
    holders = {k: layout.successor[k] for k in lost}
    orphans = [k for k, holder in holders.items() if holder in lost or replica is None]
    if orphans:
        raise PSTrainingError(f"colocated recovery: shard keys {orphans} were lost with their replicas "
                              "(a replica lives on the ring successor; two neighbours died, or replicas are off)")
    new = ColocatedLayout(layout.specs, keys, rank_nodes(comm))
    mine = copy.deepcopy(store)
    adopted = [k for k in lost if holders[k] == key]
    deliver(comm, new, mine, [(t, *replica.export(t)) for t in range(len(layout.specs))] if adopted else [])
    copied = replicate(comm, new, key, mine) if replica is not None else None
    return Restored(comm, new, mine, copied, lost)


def rebuilt(comm: MPI.Intracomm, layout: ColocatedLayout, key: int, store: ShardStore,
            replica: Optional[ShardStore], clock: int) -> Restored:
    """Shrink, restore and commit, in rounds until a round commits (steps 1-4)."""
    return restored_until_agreed(comm, lambda survivors: restore(survivors, layout, key, store, replica, clock))
