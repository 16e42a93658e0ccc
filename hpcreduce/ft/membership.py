"""Stable ids for ranks whose numbers change as the job shrinks and grows.

A rank started by the launcher keeps its ``MPI_COMM_WORLD`` rank as its id; a rank
that joins later gets the next unused number. Ids are what users name in ``--kill``
and what recovery events report; ranks are what MPI uses now.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from .rounds import Shrunk


@dataclass
class Membership:
    """``ids[r]`` is the id of rank ``r``; ``me`` this process's id."""

    ids: List[int]
    me: int
    next_id: int

    @classmethod
    def founding(cls, size: int, rank: int) -> "Membership":
        return cls(list(range(size)), rank, size)

    @classmethod
    def from_control(cls, control: Dict[str, Any], rank: int) -> "Membership":
        """A newcomer's view, from what the job broadcast to it (``control()``)."""
        return cls(list(control["ids"]), control["ids"][rank], control["next_id"])

    def control(self) -> Dict[str, Any]:
        return {"ids": self.ids, "next_id": self.next_id}

    def shrink(self, shrunk: Shrunk) -> List[int]:
        """Drop the ranks ``shrunk`` lost; return their ids."""
        lost = [self.ids[rank] for rank in shrunk.lost]
        self.ids = [identity for identity, new in zip(self.ids, shrunk.new_rank) if new is not None]
        return lost

    def leave(self, left: Sequence[int]) -> None:
        """Drop the ranks with ids ``left`` (they left gracefully); the others keep their order."""
        self.ids = [identity for identity in self.ids if identity not in set(left)]

    def grow(self, count: int) -> List[int]:
        """Add ``count`` newcomers after every current rank; return their ids."""
        joined = list(range(self.next_id, self.next_id + count))
        self.ids += joined
        self.next_id += count
        return joined
