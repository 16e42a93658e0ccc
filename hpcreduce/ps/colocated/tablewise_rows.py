"""Table-wise rows made on first touch: a table's rows drawn when a lookup, a push or a read
first reaches them, not at start.

A table held here (as its owner, ``"primary"``, or as its predecessor's replica,
``"replica"``) whose initial rows are a function of (table, id) alone starts as ``np.empty``
with a made-bitmap; ``make`` draws the not-yet-made rows among some ids with the init's own
``rows`` (the same bits as drawing the whole table at start), ``make_all`` draws every row left
(before a checkpoint is written or tables travel in a recovery). Other inits (a torch
``init_fn`` drawing from a generator: its values depend on the order of the draws) are made
whole at start, as before.
"""
from __future__ import annotations

import mmap
from typing import Dict, Optional, Tuple

import numpy as np

from ..init import PartInit
from ..kernels import kernel
from ..optimizers import Optimizer
from ..tables import row_width

FIRST_TOUCHED = kernel("index", "first_touched")


def per_row(init: Optional[PartInit], table: int) -> bool:
    """Whether ``init``'s rows of ``table`` depend on (table, id) alone: the default init's do;
    another ``PartInit`` says so with a ``per_row(table)`` method."""
    if init is None:
        return True
    declared = getattr(init, "per_row", None)
    return bool(declared(table)) if callable(declared) else False


def zeroed_state(optimizer: Optimizer, rows: np.ndarray) -> Dict[str, np.ndarray]:
    """``optimizer.init_state(rows)``'s zeroed arrays, from ``np.zeros``: no page touched until
    a row is updated."""
    return {name: untouched(rows.shape, rows.dtype) for name in optimizer.state_names}


def untouched(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros in anonymous memory with no page touched, in small pages (numpy asks for huge
    pages on large arrays: then a row's first touch zeroes 2 MiB and compacts memory, and a
    batch of random rows touches the whole table)."""
    buffer = mmap.mmap(-1, max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, dtype, int(np.prod(shape))).reshape(shape)


class FirstTouch:
    """The not-yet-made rows of the tables held here, drawn from ``init`` when touched."""

    def __init__(self, init: PartInit):
        self.init = init
        self.pending: Dict[Tuple[str, int], Tuple[np.ndarray, np.ndarray]] = {}  # (held as, table) -> rows, made

    def empty(self, held: str, table: int) -> np.ndarray:
        """Table ``table``'s rows, none made yet (no page touched)."""
        spec = self.init.specs[table]
        rows = untouched((spec.shape[0], row_width(spec)), np.dtype(spec.dtype))
        self.pending[held, table] = rows, np.zeros(spec.shape[0], np.bool_)
        return rows

    def whole(self, table: int) -> np.ndarray:
        """Table ``table``'s rows, every one made now."""
        spec = self.init.specs[table]
        return np.ascontiguousarray(self.init.rows(table, np.arange(spec.shape[0])).reshape(spec.shape[0], -1))

    def make(self, held: str, table: int, ids: np.ndarray) -> None:
        """Draw the rows among ``ids`` (int64, inside the table) not made yet."""
        entry = self.pending.get((held, table))
        if entry is None or not len(ids):
            return
        rows, made = entry
        fresh = FIRST_TOUCHED(made, ids)
        if len(fresh):
            try:
                rows[fresh] = self.init.rows(table, fresh).reshape(len(fresh), -1)
            except BaseException:
                made[fresh] = False  # not made after all
                raise

    def make_all(self) -> None:
        """Draw every row not made yet: every table held here is then whole."""
        for (held, table), (_, made) in list(self.pending.items()):
            self.make(held, table, np.flatnonzero(~made))
        self.pending.clear()

    def forget(self) -> None:
        """The tables held here were replaced by whole ones (a checkpoint loaded)."""
        self.pending.clear()
