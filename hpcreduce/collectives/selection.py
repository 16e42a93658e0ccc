"""Which algorithm ``algorithm="auto"`` runs, by message size: one table, from measurements.

Each row is (largest message in bytes, algorithm); the first row that covers the
message wins. The crossovers come from ``hpcreduce bench allreduce`` (native
``MPI_Allreduce``, the ring, recursive doubling, the hierarchical and the one-shot allreduce
interleaved call by call) on the 2-core reference machine, 2 and 4 ranks, shared-memory and tcp
transports, one node and two (docs/algorithms.md, "Auto"). There the one-shot allreduce (every
rank reads every input from the node's shared memory, the input check in the same exchange) beat
native up to 128 KiB on one node, the hierarchical allreduce (node-local shared memory, leaders
across nodes) from 256 KiB up (1.2-5.7x), the ring only from 4-16 MiB, and recursive doubling
never beat native at small sizes (Python's per-step cost is larger than the library's whole
small-message allreduce), so it has no row. One-shot runs native where the ranks span nodes or
the message exceeds its shared area; device arrays run native where the table says one_shot and
the ring where it says hierarchical (``auto_choice``), fault-tolerant jobs native or the ring
(``hierarchical.stepped_aside``). Re-measure on your cluster and set ``HPCREDUCE_AUTO_TABLE``
(e.g. ``"65536:recursive_doubling,4194304:native,inf:ring"``).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ..runtime.settings import Setting

Table = Sequence[Tuple[float, str]]

AUTO_TABLE: Table = (
    (128 * 1024, "one_shot"),
    (float("inf"), "hierarchical"),
)


CHOOSABLE = ("ring", "recursive_doubling", "native", "hierarchical", "one_shot")


def parse_table(text: str) -> Table:
    """Parse ``"BYTES:ALGORITHM,..."``: bounds rising, ``inf`` as the last; ValueError says why not."""
    rows = []
    for item in text.split(","):
        bound, _, name = item.partition(":")
        try:
            limit = float(bound)
        except ValueError:
            raise ValueError(f"{bound.strip()!r} is not a number of bytes") from None
        if name.strip() not in CHOOSABLE:
            raise ValueError(f"unknown algorithm {name.strip()!r} (known: {', '.join(CHOOSABLE)})")
        if rows and limit <= rows[-1][0] or limit < 0 or limit != limit:
            raise ValueError(f"bound {bound.strip()} must be above the one before it and 0 or more")
        rows.append((limit, name.strip()))
    if rows[-1][0] != float("inf"):
        raise ValueError("the last row must be inf:ALGORITHM")
    return tuple(rows)


TABLE = Setting("HPCREDUCE_AUTO_TABLE", parse_table, AUTO_TABLE,
                "a table of BYTES:ALGORITHM rows, e.g. 65536:native,inf:ring")


def choose(nbytes: int, table: Optional[Table] = None) -> str:
    """The algorithm for a message of ``nbytes`` bytes (by ``table``, else the active one)."""
    rows = table or TABLE.value()
    for bound, name in rows:
        if nbytes <= bound:
            return name
    return rows[-1][1]


def table_text(table: Table) -> str:
    """``table`` as ``HPCREDUCE_AUTO_TABLE`` writes it (``4194304:native,inf:ring``)."""
    return ",".join(f"{'inf' if bound == float('inf') else f'{bound:.15g}'}:{name}" for bound, name in table) or "none"
