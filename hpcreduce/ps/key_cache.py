"""Key caching (the 2014 parameter-server paper's): a worker that sends a server the same
id list again sends the list's number instead of the ids.

Worker side (``SentKeys``): per (server rank, table), the last id list sent and the number
it was given (numbers are unique per worker and never reused). A list equal to the last
one travels as its number alone: the request header's ``KEYS`` field, one payload fewer.
Server side (``KnownKeys``): per (worker slot, table), the last list received with its
number. A request naming a number the server does not hold (a server rebuilt after a
failure, or one that refused the list) is refused with ``KEYS_UNKNOWN``, and the worker
sends the ids again: a cached request never reads or updates rows it did not name.

In training, a step's ``push_rows`` names exactly the rows its ``pull_rows`` read, so the
push carries gradients only (for one float32 per row: 4 B instead of 12 B per row).
Cost: one comparison of the list with the last one (worker); a dictionary lookup (server).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np


class SentKeys:
    """The last id list a worker sent to each (server rank, table), and its number."""

    def __init__(self):
        self.last: Dict[Tuple[int, int], Tuple[int, np.ndarray]] = {}
        self.issued = 0

    def number(self, rank: int, table: int, ids: np.ndarray) -> Tuple[int, bool]:
        """(the list's number, whether the server already has it). ``ids`` must not change
        afterwards (the worker passes its own copy)."""
        last = self.last.get((rank, table))
        if last is not None and len(last[1]) == len(ids) and np.array_equal(last[1], ids):
            return last[0], True
        self.issued += 1
        self.last[(rank, table)] = (self.issued, ids)
        return self.issued, False

    def forget(self, rank: int, table: int) -> None:
        """The server did not know the list: the next request sends it whole."""
        self.last.pop((rank, table), None)


class KnownKeys:
    """The last id list each worker slot sent for each table, with its number (a server's)."""

    def __init__(self):
        self.lists: Dict[Tuple[int, int], Tuple[int, np.ndarray]] = {}

    def remember(self, slot: int, table: int, number: int, ids: np.ndarray) -> None:
        self.lists[(slot, table)] = (number, ids)

    def recall(self, slot: int, table: int, number: int) -> Optional[np.ndarray]:
        """The list numbered ``number``, if it is the last one this slot sent for ``table``."""
        known = self.lists.get((slot, table))
        return known[1] if known is not None and known[0] == number else None
