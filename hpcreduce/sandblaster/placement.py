"""Where each slice of the vectors lives: a primary server and, with fault tolerance, a replica.

Slice s of K (``protocol.slice_bounds``) starts on server s, its replica on server
(s + 1) % K when K >= 2 and replicas are asked for. The primary answers fetches, pushes
and dot products; the replica applies the same op batches and gets the primary's
accumulator once a pass (``Code.SYNC``), so both copies, L-BFGS history included, stay
equal. When servers die, ``after_loss`` maps the placement onto the survivors: a slice
whose primary died is served by its replica (a server may then serve several slices);
a slice that lost both copies cannot be recovered (``TrainingError``, on every rank).
Cost: none on the wire; re-placing is local and the same on every survivor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import TrainingError
from .protocol import slice_bounds

NONE = -1


@dataclass(frozen=True)
class Placement:
    """``bounds[s]``: [lo, hi) of slice s; ``primary[s]``, ``replica[s]``: ranks (``NONE``: no replica)."""

    bounds: Tuple[Tuple[int, int], ...]
    primary: Tuple[int, ...]
    replica: Tuple[int, ...]

    @classmethod
    def initial(cls, length: int, servers: int, replicate: bool) -> "Placement":
        copies = replicate and servers >= 2
        return cls(tuple(slice_bounds(length, servers, s) for s in range(servers)), tuple(range(servers)),
                   tuple((s + 1) % servers if copies else NONE for s in range(servers)))

    def held_by(self, rank: int) -> List[int]:
        """The slices ``rank`` keeps a copy of (primary or replica)."""
        return [s for s in range(len(self.bounds)) if rank in (self.primary[s], self.replica[s])]

    def for_workers(self) -> List[Tuple[int, int, int, int]]:
        """(primary rank, lo, hi, slice) of every slice: where workers fetch and push."""
        return [(self.primary[s], lo, hi, s) for s, (lo, hi) in enumerate(self.bounds)]

    def after_loss(self, new_rank: Sequence[Optional[int]]) -> "Placement":
        """The placement on the survivors (``new_rank[old]``: the old rank's new rank, None if dead)."""
        primary, replica = [], []
        for s in range(len(self.bounds)):
            alive = [new_rank[r] for r in (self.primary[s], self.replica[s]) if r != NONE and new_rank[r] is not None]
            if not alive:
                lo, hi = self.bounds[s]
                raise TrainingError(f"sandblaster: slice {s} (elements {lo}..{hi - 1}) lost its server and its "
                                    "replica: nothing left to recover from")
            primary.append(alive[0])
            replica.append(alive[1] if len(alive) > 1 else NONE)
        return Placement(self.bounds, tuple(primary), tuple(replica))
