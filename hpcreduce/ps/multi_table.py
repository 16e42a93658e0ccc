"""One request per server for the rows of several sparse tables (the worker's side of the MANY ops).

A step that reads or updates rows of many tables sends each server one PULL_ROWS_MANY or
PUSH_ROWS_MANY (``protocol.py``): a directory (table, ids, row width, dtype code per
table), the tables' ids concatenated, and for a push their gradients concatenated as
bytes. ``by_server`` groups the checked tables' rows per server; ``directory`` and
``concatenated`` build the payloads; ``scatter_rows`` puts a pull's reply into each
table's output (``put_rows``: a compiled loop). Cost: one header and one reply per server, instead of one per table.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

from .handles import Part, PushResult
from .kernels import kernel
from .optimizers import FUSED_DTYPES
from .protocol import Rep, Status
from .updates import rows_2d

SCATTER = kernel("rows", "scatter")
Groups = List[Tuple[int, np.ndarray]]  # (server rank, positions in the table's ids)


class Entry(NamedTuple):
    """One table's share of a request to one server."""

    table: int        # index into the call's tables
    where: np.ndarray  # positions of its ids that this server owns


def by_server(groups: Sequence[Groups]) -> Dict[int, List[Entry]]:
    """Server rank -> the tables (in call order) with rows there, from each table's groups."""
    plan: Dict[int, List[Entry]] = {}
    for index, table_groups in enumerate(groups):
        for rank, where in table_groups:
            plan.setdefault(rank, []).append(Entry(index, where))
    return plan


def directory(entries: Sequence[Entry], tables: Sequence[int], widths: Sequence[int],
              codes: Sequence[int]) -> np.ndarray:
    """The directory payload: (table id, ids, row width, wire dtype code) per entry."""
    return np.array([(tables[e.table], len(e.where), widths[e.table], codes[e.table]) for e in entries],
                    dtype=np.int64).reshape(-1, 4)


def concatenated(entries: Sequence[Entry], arrays: Sequence[np.ndarray], *, raw: bool = False) -> np.ndarray:
    """Each entry's rows of its table's array, one after the other (``raw``: as bytes)."""
    pieces = [arrays[e.table][e.where] for e in entries]
    if raw:
        pieces = [np.ascontiguousarray(p).reshape(-1).view(np.uint8) for p in pieces]
    return np.concatenate(pieces) if pieces else np.empty(0, np.uint8 if raw else np.int64)


def reply_bytes(entries: Sequence[Entry], widths: Sequence[int], wires: Sequence[np.dtype]) -> int:
    """Bytes of a PULL_ROWS_MANY reply for ``entries``."""
    return sum(len(e.where) * widths[e.table] * wires[e.table].itemsize for e in entries)


def scatter_rows(reply: np.ndarray, entries: Sequence[Entry], outs: Sequence[np.ndarray],
                 wires: Sequence[np.dtype]) -> None:
    """Put a PULL_ROWS_MANY reply's rows (bytes, in entry order) at their positions in each output."""
    offset = 0
    for e in entries:
        out = outs[e.table]
        rows = len(e.where)
        size = rows * (out[0].size if len(out) else 0) * wires[e.table].itemsize
        put_rows(out, e.where, reply[offset:offset + size].view(wires[e.table]).reshape((rows,) + out.shape[1:]))
        offset += size


def put_rows(out: np.ndarray, where: np.ndarray, rows: np.ndarray) -> None:
    """``out[where] = rows``: a compiled loop when both are float32 or float64 alike."""
    if out.dtype != rows.dtype or out.dtype not in FUSED_DTYPES or not out.flags.c_contiguous:
        out[where] = rows
        return
    SCATTER(rows_2d(out), np.ascontiguousarray(where, dtype=np.int64), rows_2d(rows))


def push_results(parts: Sequence[Part], plans: Sequence[List[Entry]], names: Sequence[str]) -> Dict[str, PushResult]:
    """Each table's ``PushResult``: the servers it went to, and how many answered DUPLICATE
    (a server answers DUPLICATE when every table of its request was one)."""
    pieces = [0] * len(names)
    duplicates = [0] * len(names)
    for part, entries in zip(parts, plans):
        duplicate = int(part.reply[Rep.STATUS] == Status.DUPLICATE)
        for e in entries:
            pieces[e.table] += 1
            duplicates[e.table] += duplicate
    return {name: PushResult(pieces[i], duplicates[i]) for i, name in enumerate(names)}
