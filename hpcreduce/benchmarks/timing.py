"""Interleaved timing: every candidate is called in turn, so machine drift hits all alike.

Each call starts after a barrier; a call's time is the slowest rank's, and a
candidate's figure is the median over the measured calls.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..runtime.environment import mpi_library
from ..runtime.options import parse_size

Call = Callable[[], object]


def interleaved_medians(comm: MPI.Intracomm, candidates: Dict[str, Call], *,
                        warmup: int, iterations: int, shuffle: bool = False, settle: int = 0) -> Dict[str, float]:
    """Median seconds per call of each candidate, calls interleaved round by round (with
    ``shuffle``, each round in another order, the same on every rank, so no candidate keeps
    following the same one: one that leaves threads busy, as torch's gloo does, slows every
    candidate alike; a rotation of one order would leave it slowing its successor nearly always).
    ``settle``: untimed calls a candidate makes before its timed one in each round (its own
    state warm in the caches again, as in a loop of its calls)."""
    names = list(candidates)
    times = np.zeros((len(names), iterations))
    for round_index in range(warmup + iterations):
        order = np.random.default_rng(round_index).permutation(len(names)) if shuffle else range(len(names))
        for row, name in [(int(row), names[row]) for row in order]:
            for _ in range(settle):
                candidates[name]()
            comm.Barrier()
            start = time.perf_counter()
            candidates[name]()
            elapsed = time.perf_counter() - start
            if round_index >= warmup:
                times[row, round_index - warmup] = elapsed
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return {name: float(np.median(times[row])) for row, name in enumerate(names)}


def iterations_for(nbytes: int, *, budget_bytes: int = 1 << 30, least: int = 5, most: int = 200) -> int:
    """Enough calls for a stable median, fewer for large messages."""
    return int(min(most, max(least, budget_bytes // max(1, nbytes) // 8)))


def transport(btl: str) -> str:
    """Open MPI's byte transports as ``OMPI_MCA_btl`` chose them: named, or the default ones
    (shared memory within a node) less those it leaves out (``^ofi``)."""
    if btl and not btl.startswith("^"):
        return btl
    return "default (shared memory)" + (f" without {btl[1:]}" if btl else "")


def launch_facts(comm: MPI.Intracomm) -> Dict[str, object]:
    """What the numbers depend on: ranks, cores, transport, oversubscription.

    Ranks may be bound to one core each, so the node's cores are counted, not the
    process's affinity, and compared with the ranks sharing this node.
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks_here = node.Get_size()
    node.Free()
    cores = os.cpu_count() or 1
    return {
        "ranks": comm.Get_size(),
        "ranks_per_node": ranks_here,
        "cores": cores,
        "oversubscribed": ranks_here > cores,
        "transport": transport(os.environ.get("OMPI_MCA_btl", "")),
        "mpi_library": mpi_library(MPI),
    }


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def sizes_argument(text: str) -> Sequence[int]:
    return [parse_size(part) for part in text.split(",") if part.strip()]


def size_rows(nbytes: int, medians: Dict[str, float], ranks: int,
              peers: Sequence[str]) -> List[Dict[str, object]]:
    """One row per candidate: median, algbw, busbw and busbw relative to each peer."""
    rows = []
    for name, seconds in medians.items():
        algbw = nbytes / seconds / 1e9
        row: Dict[str, object] = {
            "bytes": nbytes, "algorithm": name, "median_s": seconds, "algbw_GBps": algbw,
            "busbw_GBps": algbw * 2 * (ranks - 1) / ranks if ranks > 1 else algbw}
        row.update({f"busbw_vs_{peer}": medians[peer] / seconds for peer in peers})
        rows.append(row)
    return rows


def fusion(comm: MPI.Intracomm, fused: Callable[[], object], one_call_each: Callable[[], object],
           arrays: Sequence, views: Optional[Callable[[], object]] = None) -> Dict[str, object]:
    """One allreduce_many over many small arrays against one native call per array; with
    ``views``, also allreduce_many in place over views of persistent fusion buffers (no copies),
    in a round of its own against the native calls: interleaved after the copying call, which
    allocates its results anew each time, the views call measured up to 2x slower on 2 cores
    (the memory the copying call touched and freed, not the views, made the difference)."""
    medians = interleaved_medians(comm, {"native_per_array": one_call_each, "allreduce_many": fused},
                                  warmup=3, iterations=30)
    result = {"arrays": len(arrays), "elements": int(arrays[0].size) if arrays else 0, **medians,
              "speedup": medians["native_per_array"] / medians["allreduce_many"]}
    if views is not None:
        alone = interleaved_medians(comm, {"native_per_array": one_call_each, "allreduce_many_views": views},
                                    warmup=3, iterations=30)
        result["allreduce_many_views"] = alone["allreduce_many_views"]
        result["views_native_per_array"] = alone["native_per_array"]
        result["views_speedup"] = alone["native_per_array"] / alone["allreduce_many_views"]
    return result
