"""Sandblaster (DistBelief's distributed batch optimisation) as a library over MPI ranks.

Ranks 0..K-1 are servers holding slices of named vectors (``server``), rank K the
coordinator (``coordinator``: vector ops, passes of work units with load balancing and
backup tasks, ``lbfgs``: L-BFGS or gradient descent as op programs), the others workers
(``worker``: fetch, compute units, push). For fault tolerance each slice also lives on a
replica server (``placement``) and the coordinator's committed state on every server
(``record``). ``hpcreduce.train.sandblaster`` trains a model with it. Wire format: ``protocol``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..errors import SettingProblem, setting_problem
from .protocol import slice_bounds

METHODS = ("lbfgs", "gd")


def roles_problem(servers: int, size: int) -> Optional[SettingProblem]:
    """Why K servers, a coordinator and at least one worker do not fit ``size`` ranks."""
    if servers < 1 or size < servers + 2:
        return setting_problem("{mode} sandblaster needs {servers} K >= 1 server ranks, one coordinator and at "
                               "least one worker: K + 2 <= ranks, got K = {value} on {size} ranks",
                               value=servers, size=size)
    return None


@dataclass(frozen=True)
class Roles:
    """Who is who: servers 0..K-1, the coordinator K, workers K+1..size-1."""

    servers: int
    size: int

    @property
    def coordinator(self) -> int:
        return self.servers

    @property
    def workers(self) -> List[int]:
        return list(range(self.servers + 1, self.size))

    def slices(self, length: int) -> List[Tuple[int, int, int]]:
        """(server rank, lo, hi) of each server's slice of a vector of ``length``."""
        return [(k, *slice_bounds(length, self.servers, k)) for k in range(self.servers)]


def unit_size(batch: int, unit: Optional[int], workers: int) -> int:
    """Examples per work unit: ``unit``, or by default batch // (8 * workers), at least 1."""
    return unit if unit else max(1, batch // (8 * max(workers, 1)))
