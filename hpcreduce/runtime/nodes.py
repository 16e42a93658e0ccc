"""Which node each rank runs on: its hostname, gathered over a communicator.

Under ``srun -N 2``, ``mpirun`` in a Slurm allocation or ``mpirun --hostfile`` the ranks
of one node share a hostname, so one picture serves every launcher.
"""
from __future__ import annotations

import socket
from typing import Dict, List, Sequence


def this_node() -> str:
    """This process's node: the short hostname."""
    return socket.gethostname().split(".")[0] or "localhost"


def rank_nodes(comm) -> List[str]:
    """The node of every rank of ``comm``, by rank (collective; the same list on every rank)."""
    return comm.allgather(this_node())


def ranks_by_node(nodes: Sequence[str]) -> Dict[str, List[int]]:
    """{node: its ranks}, nodes in the order of their first rank."""
    found: Dict[str, List[int]] = {}
    for rank, node in enumerate(nodes):
        found.setdefault(node, []).append(rank)
    return found


def _span(ranks: Sequence[int]) -> str:
    contiguous = list(ranks) == list(range(ranks[0], ranks[-1] + 1))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {ranks[0]}-{ranks[-1]}" if contiguous else "ranks " + ",".join(map(str, ranks))


def describe(nodes: Sequence[str]) -> str:
    """``2 nodes: node1 (ranks 0-1), node2 (ranks 2-3)``."""
    groups = ranks_by_node(nodes)
    listed = ", ".join(f"{node} ({_span(ranks)})" for node, ranks in groups.items())
    return f"{len(groups)} node{'s' if len(groups) != 1 else ''}: {listed}"
