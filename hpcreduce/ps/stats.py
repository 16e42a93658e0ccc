"""What the servers measured, merged over shards: push counters, refusals, staleness.

Histograms are lists indexed by clocks: ``hist[k]`` counts the events k clocks stale.
Read staleness: how many clocks behind the reader the slowest worker was when a read
was answered. Update lag: how many updates a table piece received between a worker's
read of it and that worker's push. Load: requests and bytes each server handled per step,
and its CPU seconds per step (a server that waits without spinning spends few).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Dict, Iterable, List, Mapping, Optional

import numpy as np

from .protocol import HEADER_LEN
from .shard_state import COUNTERS, ShardState


def histogram(clocks: Iterable[int]) -> List[int]:
    """Counts of each staleness value: ``result[k]`` = how many were ``k`` clocks stale."""
    values = np.asarray(list(clocks), dtype=np.int64)
    return np.bincount(values).tolist() if values.size else []


def staleness_summary(read_clocks: Iterable[int], lag_clocks: Iterable[int]) -> Dict[str, Any]:
    """``read_max`` and ``read_hist`` of how stale the parameters each read saw were, and
    ``lag_hist`` of how many clocks late each gradient was applied."""
    reads = histogram(read_clocks)
    return {"read_max": len(reads) - 1 if reads else 0, "read_hist": reads,
            "lag_hist": histogram(lag_clocks)}


def merge_summaries(summaries: List[Optional[Mapping[str, object]]], slot_count: int) -> Dict[str, object]:
    """The servers' ``ShardState.summary()`` (None from workers), by rank, merged: push
    counters per worker slot summed over shards, refusal reasons, the staleness histograms,
    and each server's dynamic tables (rows and bytes held, rows seen, admitted, evicted,
    dropped; ``dynamic_rows``, by server rank) when it has any."""
    merged = {name: np.zeros(slot_count, np.int64) for name in COUNTERS}
    refusals: Counter = Counter()
    reads: Counter = Counter()
    lags: Counter = Counter()
    for summary in filter(None, summaries):
        for key in merged:
            merged[key] += np.asarray(summary[key], dtype=np.int64)
        refusals.update(summary["refusals"])
        reads.update(summary["read_staleness"])
        lags.update(summary["update_lag"])
    rows = [{"rank": rank, **summary["dynamic_rows"]} for rank, summary in enumerate(summaries)
            if summary and "dynamic_rows" in summary]
    return {
        "staleness": staleness_summary(_values(reads), _values(lags)),
        "pushes": {"applied_per_worker": merged["applied"].tolist(),
                   "duplicates_per_worker": merged["duplicates"].tolist(),
                   "refused_per_worker": merged["refused"].tolist(),
                   "refusals": dict(refusals)},
        **({"dynamic_rows": rows} if rows else {}),
    }


def server_traffic(state: ShardState, steps: int) -> List[List[int]]:
    """A server's payload bytes [sent, received] for each step, from the requests' clocks."""
    return [state.traffic.get(step, [0, 0]) for step in range(steps)]


class RequestLoad:
    """A server's load per step: requests received and bytes moved (payloads plus the
    72 B headers each way). A request counts for the step its worker was in (its clock;
    a ``CLOCK`` for the step it ends)."""

    HEADER_BYTES = HEADER_LEN * 8

    def __init__(self):
        self.cells: Dict[int, List[int]] = {}
        self.cpu_at: Dict[int, float] = {}  # process CPU seconds when the slowest clock first reached a step

    def reached(self, slowest: int) -> None:
        """The slowest live worker's clock is now ``slowest`` (past the last step when none is live)."""
        self.cpu_at.setdefault(slowest, time.process_time())

    def cpu_per_step(self, steps: int) -> List[float]:
        """This process's CPU seconds while the slowest clock was at each step 0..steps-1 (0 for
        steps it never saw begin and end)."""
        marks = sorted(self.cpu_at.items())
        out = [0.0] * steps
        for (step, begin), (_, end) in zip(marks, marks[1:]):
            if 0 <= step < steps:
                out[step] = round(end - begin, 6)
        return out

    def request(self, step: int, nbytes: int) -> None:
        cell = self.cells.setdefault(step, [0, 0])
        cell[0] += 1
        cell[1] += nbytes + self.HEADER_BYTES

    def reply(self, step: int, nbytes: int) -> None:
        self.cells.setdefault(step, [0, 0])[1] += nbytes + self.HEADER_BYTES

    def per_step(self, steps: int) -> List[List[int]]:
        """[requests, bytes] for each step 0..steps-1."""
        return [self.cells.get(step, [0, 0]) for step in range(steps)]


def load_summary(per_server: Mapping[int, List[List[int]]],
                 cpu: Optional[Mapping[int, List[float]]] = None) -> Dict[str, Any]:
    """``ps.load``: each server's requests and bytes per step (by server rank), and the
    imbalance over the whole run: max over servers / mean over servers of the totals;
    with ``cpu``, each server's CPU seconds per step (``RequestLoad.cpu_per_step``)."""
    ranks = sorted(per_server)
    cells = np.array([per_server[rank] for rank in ranks], dtype=np.float64).reshape(len(ranks), -1, 2)
    totals = cells.sum(axis=1)
    means = totals.mean(axis=0)
    ratio = np.divide(totals.max(axis=0), means, out=np.ones(2), where=means > 0)
    return {"server_ranks": ranks,
            "requests_per_step": cells[:, :, 0].astype(np.int64).tolist(),
            "bytes_per_step": cells[:, :, 1].astype(np.int64).tolist(),
            "requests_max_mean": round(float(ratio[0]), 4), "bytes_max_mean": round(float(ratio[1]), 4),
            **({"cpu_s_per_step": [list(cpu[rank]) for rank in ranks]} if cpu else {})}


def _values(counts: Counter) -> np.ndarray:
    keys = np.array(sorted(counts), dtype=np.int64)
    return np.repeat(keys, [counts[k] for k in keys]) if keys.size else keys
