"""Ping-pong times of the two links a job can have: within a node and between nodes.

``measure`` (collective) times, per message size, ping-pongs between rank 0 and another
rank of its node, and rank 0 and the first rank of another node, interleaved repeat by
repeat (both links see the same machine state); the one-way time is half the round trip,
median over the repeats. A link the job does not have (one node; one rank on rank 0's
node) is None. ``cost_model.fit_link(..., ring=False)`` fits each; ``hpcreduce bench
allreduce --links`` runs it after its allreduce rows (``bench scaling`` asks for it).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..runtime.nodes import rank_nodes, ranks_by_node
from .timing import iterations_for

TAG = 77
MOST_REPEATS = 20


def peers(nodes: Sequence[str]) -> Dict[str, Optional[int]]:
    """Rank 0's partner on each link: another rank of its node, the first rank of another node."""
    groups = ranks_by_node(nodes)
    mine = groups[nodes[0]]
    others = [ranks[0] for node, ranks in groups.items() if node != nodes[0]]
    return {"within": mine[1] if len(mine) > 1 else None, "between": others[0] if others else None}


def measure(comm: MPI.Intracomm, sizes: Sequence[int]) -> Dict[str, Any]:
    """{sizes, nodes (of every rank), ranks_per_node (the most on one node), within, between
    (median one-way seconds per size, or None)} on every rank (collective)."""
    nodes = rank_nodes(comm)
    partners = {link: peer for link, peer in peers(nodes).items() if peer is not None}
    times: Dict[str, List[float]] = {link: [] for link in partners}
    rank = comm.Get_rank()
    for size in sizes:
        buffer = np.zeros(size, dtype=np.uint8)
        samples: Dict[str, List[float]] = {link: [] for link in partners}
        for _ in range(min(MOST_REPEATS, iterations_for(size))):
            for link, peer in partners.items():
                if rank == 0:
                    began = time.perf_counter()
                    comm.Send(buffer, peer, TAG)
                    comm.Recv(buffer, peer, TAG)
                    samples[link].append((time.perf_counter() - began) / 2)
                elif rank == peer:
                    comm.Recv(buffer, 0, TAG)
                    comm.Send(buffer, 0, TAG)
        for link in partners:
            times[link].append(float(np.median(samples[link])) if rank == 0 else 0.0)
    found = comm.bcast(times if rank == 0 else None, root=0)
    return {"sizes": list(sizes), "nodes": nodes, "ranks_per_node": max(Counter(nodes).values()),
            "within": found.get("within"), "between": found.get("between")}


def render(links: Dict[str, Any]) -> List[str]:
    """One line per link: its one-way median at each size."""
    lines = []
    for link in ("within", "between"):
        if links[link] is not None:
            pairs = zip(links["sizes"], links[link])
            cells = ", ".join(f"{size} B {seconds * 1e6:.1f} us" for size, seconds in pairs)
            lines.append(f"ping-pong {link} nodes (one way): {cells}")
    return lines
