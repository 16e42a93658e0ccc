"""Which algorithm ``algorithm="auto"`` runs, by message size: one table, from measurements.

Each row is (largest message in bytes, algorithm); the first row that covers the
message wins. The crossovers come from ``hpcreduce bench allreduce`` (native
``MPI_Allreduce``, the ring and recursive doubling interleaved call by call) on the
2-core reference machine, 2 and 4 ranks, shared-memory and tcp transports; see
docs/results.md (Allreduce) for the table they were read from. There the ring overtook native
from 4 MiB up at 2 ranks (16 MiB at 4 oversubscribed ranks), and recursive doubling never
beat native at small sizes (Python's per-step cost is larger than the library's whole
small-message allreduce), so it has no row. Re-measure on your cluster and set
``HPCREDUCE_AUTO_TABLE`` (e.g. ``"65536:recursive_doubling,4194304:native,inf:ring"``).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

Table = Sequence[Tuple[float, str]]

AUTO_TABLE: Table = (
    (4 * 1024 * 1024, "native"),
    (float("inf"), "ring"),
)


def parse_table(text: str) -> Table:
    """Parse ``"BYTES:ALGORITHM,..."`` (``inf`` allowed as the last bound)."""
    rows = []
    for item in text.split(","):
        bound, _, name = item.partition(":")
        rows.append((float(bound), name.strip()))
    if not rows or rows[-1][0] != float("inf"):
        raise ValueError(f"HPCREDUCE_AUTO_TABLE={text!r} must end with an inf:ALGORITHM row")
    return tuple(rows)


_ACTIVE: Table = parse_table(os.environ["HPCREDUCE_AUTO_TABLE"]) \
    if os.environ.get("HPCREDUCE_AUTO_TABLE") else AUTO_TABLE


def choose(nbytes: int, table: Optional[Table] = None) -> str:
    """The algorithm for a message of ``nbytes`` bytes (by ``table``, else the active one)."""
    for bound, name in table or _ACTIVE:
        if nbytes <= bound:
            return name
    return (table or _ACTIVE)[-1][1]
