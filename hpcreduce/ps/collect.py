"""After a PS run: whole parameters on every rank, and the servers' counters merged.

Both are collective over every rank (servers and workers) and run once, after the
servers stopped serving. Cost of ``assemble_params``: one broadcast per dense piece
and one per (sparse table, shard): the model's bytes, from its servers to all ranks.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Mapping, Optional

import numpy as np
from mpi4py import MPI

from ..train.results import staleness_summary
from .layout import Layout
from .state import ShardState


def assemble_params(comm: MPI.Intracomm, layout: Layout,
                    state: Optional[ShardState]) -> Dict[str, np.ndarray]:
    """Every table whole, on every rank, broadcast piece by piece from its server."""
    rank = comm.Get_rank()
    params: Dict[str, np.ndarray] = {}
    for table, spec in enumerate(layout.specs):
        whole = np.empty(spec.shape, dtype=spec.dtype)
        if spec.sparse:
            owners = layout.placement.row_owners(table, np.arange(spec.shape[0], dtype=np.int64))
            for shard, root in sorted(layout.shard_ranks.items()):
                ids = np.flatnonzero(owners == shard)
                rows = state.tables[table].values if rank == root else \
                    np.empty((len(ids),) + tuple(spec.shape[1:]), dtype=spec.dtype)
                comm.Bcast(rows, root=root)
                whole[ids] = rows
        else:
            flat = whole.reshape(-1)
            for piece in layout.placement.pieces[table]:
                root = layout.shard_ranks[piece.shard]
                if rank == root:
                    flat[piece.start:piece.stop] = state.tables[table].values
                comm.Bcast(flat[piece.start:piece.stop], root=root)
        params[spec.name] = whole
    return params


def merge_summaries(summaries: List[Optional[Mapping[str, object]]], workers: int) -> Dict[str, object]:
    """The servers' ``ShardState.summary()`` (None from workers) merged: push counters per
    worker slot (``workers`` slots) summed over shards, refusal reasons, and the staleness
    histograms."""
    merged = {"applied": np.zeros(workers, np.int64), "duplicates": np.zeros(workers, np.int64),
              "refused": np.zeros(workers, np.int64)}
    refusals: Counter = Counter()
    reads: Counter = Counter()
    lags: Counter = Counter()
    for summary in filter(None, summaries):
        for key in merged:
            merged[key] += np.asarray(summary[key], dtype=np.int64)
        refusals.update(summary["refusals"])
        reads.update(summary["read_staleness"])
        lags.update(summary["update_lag"])
    return {
        "staleness": staleness_summary(_values(reads), _values(lags)),
        "pushes": {"applied_per_worker": merged["applied"].tolist(),
                   "duplicates_per_worker": merged["duplicates"].tolist(),
                   "refused_per_worker": merged["refused"].tolist(),
                   "refusals": dict(refusals)},
    }


def server_traffic(state: ShardState, steps: int) -> List[List[int]]:
    """A server's payload bytes [sent, received] for each step, from the requests' clocks."""
    return [state.traffic.get(step, [0, 0]) for step in range(steps)]


def _values(histogram: Counter) -> np.ndarray:
    keys = np.array(sorted(histogram), dtype=np.int64)
    return np.repeat(keys, [histogram[k] for k in keys]) if keys.size else keys
