"""A worker's values on the wire: the dtype a table's values travel in (``wire_dtype``: float16
halves float32's bytes) and the checked cast to it, what the worker sends for each table
(``WireTable``, worked out once), and which server holds which of some ids."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from ..arrays.finite import all_finite
from ..errors import PSInputError
from . import protocol
from .kernels import kernel
from .layout import Layout
from .tables import ParamSpec, row_width

GROUP = kernel("route", "group")  # a stable counting sort of positions by shard


def wire_of(spec: ParamSpec, wire_dtype: Optional[np.dtype]) -> np.dtype:
    """The dtype ``spec``'s values travel in: ``wire_dtype`` when it is a narrower float."""
    if wire_dtype is None:
        return np.dtype(spec.dtype)
    return protocol.wire_dtype(spec.dtype, wire_dtype)


@dataclass(frozen=True)
class WireTable:
    """One table as a worker sends it: its id and spec, its stored dtype, the dtype its values
    travel in and that dtype's code, a request's row width (1 for a dense table), and a dense
    table's pieces as (server rank, start, stop) of its flat values."""

    table: int
    spec: ParamSpec
    dtype: np.dtype
    wire: np.dtype
    code: int
    width: int
    pieces: Tuple[Tuple[int, int, int], ...]


def wire_table(layout: Layout, table: int, wire_dtype: Optional[np.dtype]) -> WireTable:
    """Table ``table`` of ``layout`` as a worker with ``wire_dtype`` sends it."""
    spec = layout.specs[table]
    wire = wire_of(spec, wire_dtype)
    pieces = () if spec.sparse else tuple((layout.shard_ranks[piece.shard], piece.start, piece.stop)
                                          for piece in layout.placement.pieces[table])
    return WireTable(table, spec, np.dtype(spec.dtype), wire, protocol.dtype_code(wire),
                     row_width(spec) if spec.sparse else 1, pieces)


def on_wire(what: str, values: np.ndarray, wire: np.dtype) -> np.ndarray:
    """``values`` cast to the wire dtype ``wire`` (``WireTable.wire``; as they are when it is
    theirs); ``PSInputError`` when the cast makes finite values Inf (past float16's largest),
    which the server would refuse as a non-finite gradient without saying why. Cost: one
    finiteness pass over the cast values, only on a narrower wire."""
    sent = values.astype(wire, copy=False)
    if sent.dtype != values.dtype and not all_finite(sent) and all_finite(values):
        raise PSInputError(f"{what} has values up to {float(np.abs(values).max()):.6g}, past {wire}'s largest, "
                           f"{float(np.finfo(wire).max):.0f}: they overflow to Inf on the {wire} wire "
                           "(wire_dtype); the gradient was finite before the cast. Use a float32 wire "
                           "(--wire-dtype float32) or scale the loss down")
    return sent


def by_shard(layout: Layout, table: int, ids: np.ndarray) -> List[Tuple[int, np.ndarray]]:
    """(server rank, positions in ids) for each shard owning some of ``ids`` (one shard: all of them,
    in order, so ``ids[where]`` is ``ids``)."""
    if not len(ids):
        return []
    placement = layout.placement
    if len(placement.shards) == 1:
        return [(layout.shard_ranks[placement.shards[0]], np.arange(len(ids)))]
    order, starts = GROUP(placement.owner_index(table, ids), len(placement.shards))
    return [(layout.shard_ranks[key], order[starts[k]:starts[k + 1]])
            for k, key in sorted(enumerate(placement.shards), key=lambda pair: pair[1]) if starts[k + 1] > starts[k]]
