"""Tables: what a parameter server holds. Declared by ``ParamSpec``, one per parameter.

A dense table is a tensor, cut into element ranges over the shards; a sparse table is
``shape[0]`` rows keyed by int64 id, each row owned by one shard. A shard finds its own
rows by id through a ``RowIndex``: a direct index for tables up to 2**22 rows, above that
a bucketed binary search over the sorted ids it owns (kept as int32 while they fit), so a
large table costs a shard memory for its own rows, not for the table's.

A *dynamic* table (``ParamSpec(..., dynamic=Dynamic(...))``, ``shape[0]`` 0) has no fixed
rows: it is keyed by any int64 id, a row exists once pushes admitted its id, and a shard
evicts its coldest rows past a memory budget (``ps.dynamic_rows``). An id without a row
reads as its initial value, a function of (seed, table, id) alone (``initial_rows``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..arrays.hashing import GOLDEN, mix64, name_key, unit_uniform
from .kernels import kernel

EVICTIONS = ("lru", "lfu")


COUNTER_NORMAL, COUNTER_NORMAL_ROWS = kernel("normal", "counter_normal"), kernel("normal", "counter_normal_rows")
SKETCH_COUNT_MAX = int(np.iinfo(np.uint16).max)  # the admission sketch's counters are uint16


@dataclass(frozen=True)
class Dynamic:
    """How a dynamic table's rows come and go on each shard.

    ``admit_after``: an id gets a row on the push that sees it for the ``admit_after``-th
    time (1: its first push); the pushes before are counted and their gradients dropped.
    ``admit_probability``: then admitted with this probability (a coin per (id, sighting),
    the same on a replica). ``budget_bytes``: per shard, values, optimizer state and index
    included (0: unbounded); past it the coldest rows go, ``eviction`` by least recent
    (``lru``) or least frequent (``lfu``) use, and an evicted id that comes back starts
    again. ``init_scale``: rows start N(0, ``init_scale``**2), as a fixed table's, drawn
    from (``seed``, table, id, column).
    """

    admit_after: int = 1
    admit_probability: float = 1.0
    budget_bytes: int = 0
    eviction: str = "lru"
    init_scale: float = 0.01
    seed: int = 0

    def problem(self) -> Optional[str]:
        """What is wrong with these settings (None when nothing is)."""
        if isinstance(self.admit_after, bool) or not isinstance(self.admit_after, (int, np.integer)) \
                or self.admit_after < 1:
            return f"admit_after must be a whole number >= 1 (pushes of an id before it gets a row), got {self.admit_after!r}"
        if self.admit_after > SKETCH_COUNT_MAX:
            return (f"admit_after must be at most {SKETCH_COUNT_MAX} (the admission sketch counts sightings "
                    f"in uint16: a larger count is never reached), got {self.admit_after!r}")
        if not 0.0 < float(self.admit_probability) <= 1.0:
            return f"admit_probability must be in (0, 1], got {self.admit_probability!r}"
        if not isinstance(self.budget_bytes, (int, np.integer)) or self.budget_bytes < 0:
            return f"budget_bytes must be a whole number of bytes >= 0 (0: unbounded), got {self.budget_bytes!r}"
        if self.eviction not in EVICTIONS:
            return f"eviction must be one of {', '.join(EVICTIONS)}, got {self.eviction!r}"
        if not np.isfinite(self.init_scale) or self.init_scale < 0:
            return f"init_scale must be finite and >= 0, got {self.init_scale!r}"
        return None


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter. A sparse one is a table of ``shape[0]`` rows keyed by id;
    only the rows a batch touches are pulled, and only their gradients travel."""

    name: str
    shape: Tuple[int, ...]
    dtype: str = "float32"
    sparse: bool = False
    dynamic: Optional[Dynamic] = None

    def problem(self) -> Optional[str]:
        """What is wrong with this declaration (None when nothing is)."""
        if self.dynamic is None:
            return None
        if not self.sparse or len(self.shape) < 2 or self.shape[0] != 0:
            return (f"table {self.name!r} is dynamic, so it must be sparse with shape (0, *row_shape) "
                    f"(rows come and go by id), got sparse={self.sparse}, shape={tuple(self.shape)}")
        problem = self.dynamic.problem()
        return f"table {self.name!r}: {problem}" if problem else None


def dynamic_table(name: str, row_shape, dynamic: Dynamic = Dynamic(), dtype: str = "float32") -> ParamSpec:
    """A dynamic sparse table of rows shaped ``row_shape`` (an int: a vector), keyed by any int64 id."""
    row = (int(row_shape),) if isinstance(row_shape, (int, np.integer)) else tuple(row_shape)
    return ParamSpec(name, (0,) + row, dtype, sparse=True, dynamic=dynamic)


def initial_rows(spec: ParamSpec, ids: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The initial values of rows ``ids`` of dynamic table ``spec`` (into ``out``, rows where a
    table keeps them, when given): N(0, init_scale**2), as a fixed table's rows start, each
    element a function of (seed, table name, id, column) alone (``counter_normal`` of element
    id * width + column), so any shard, replica or worker makes the same ones, and a fixed
    table of the same name and seed starts with the same rows. float32 rows are drawn in
    place (``out`` C-contiguous) by one compiled loop (``kernels.normal.counter_normal_rows``):
    no array of element numbers and no copy, an int64 and a float32 fewer an element."""
    dynamic = spec.dynamic
    width = row_width(spec)
    if out is None:
        out = np.empty((len(ids),) + tuple(spec.shape[1:]), spec.dtype)
    if np.dtype(spec.dtype) == np.float32:
        rows = out.view()
        rows.shape = (len(out), width)  # a view, or AttributeError: never a copy drawn into and dropped
        COUNTER_NORMAL_ROWS(table_key(dynamic.seed, spec.name), np.ascontiguousarray(ids, dtype=np.int64),
                            float(dynamic.init_scale), rows)
        return out
    with np.errstate(over="ignore"):  # any int64 id: the element's number wraps, as a hash key
        flat = (np.asarray(ids, dtype=np.int64).astype(np.uint64)[:, None] * np.uint64(width)
                + np.arange(width, dtype=np.uint64)).reshape(-1)
    out[...] = counter_normal(dynamic.seed, spec.name, flat, dynamic.init_scale, spec.dtype).reshape(out.shape)
    return out


def table_key(seed: int, name: str) -> np.uint64:
    """The hash key of table ``name``'s initial values under ``seed``."""
    with np.errstate(over="ignore"):
        return mix64(np.array([seed], np.uint64) * GOLDEN ^ name_key(name))[0]


def counter_normal(seed: int, name: str, flat: np.ndarray, scale: float = 1.0,
                   dtype: str = "float32") -> np.ndarray:
    """N(0, scale**2) values for elements ``flat`` of table ``name``, each a function of
    (seed, name, index) alone (Box-Muller on two counter-based uniforms). float32 values come
    from one compiled loop (``kernels.normal``, 4x faster; the same float32 values: its libm may
    differ from numpy's in the last bit of a float64, which float64 output keeps numpy's for)."""
    key = table_key(seed, name)
    if np.dtype(dtype) == np.float32:
        flat = np.asarray(flat)
        flat = np.ascontiguousarray(flat if flat.dtype in (np.int64, np.uint64) else flat.astype(np.int64))
        out = np.empty(flat.shape, np.float32)
        COUNTER_NORMAL(key, flat.reshape(-1), float(scale), out.reshape(-1))
        return out
    with np.errstate(over="ignore"):
        hashed = mix64(key ^ (np.asarray(flat).astype(np.uint64) * GOLDEN))
        first = 1.0 - unit_uniform(hashed)  # (0, 1]: the logarithm stays finite
        second = unit_uniform(mix64(hashed + GOLDEN))
    return (np.sqrt(-2.0 * np.log(first)) * np.cos(2.0 * np.pi * second) * scale).astype(dtype)


def numel(spec: ParamSpec) -> int:
    """Elements of the whole table."""
    return int(math.prod(spec.shape))


def row_width(spec: ParamSpec) -> int:
    """Elements per row of a sparse table (1 for a one-dimensional table)."""
    return int(math.prod(spec.shape[1:]))


def id_dtype(rows: int) -> np.dtype:
    """The dtype a shard keeps row ids of a ``rows``-row table in: int32 while they (and the
    bucket edges of ``RowIndex``) fit."""
    return np.dtype(np.int32 if rows <= 2**30 else np.int64)


DIRECT_POSITIONS, BUCKET_POSITIONS = kernel("index", "direct_positions"), kernel("index", "bucket_positions")
FIRST_BAD_ID = kernel("index", "first_bad_id")
ANY_ID = (np.iinfo(np.int64).min, np.iinfo(np.int64).max)


def first_bad_id(ids: np.ndarray, rows: Optional[int], increasing: bool = False) -> int:
    """Where the first of int64 ``ids`` outside ``[0, rows)`` is (``rows`` None: any int64 is in);
    when there is none and ``increasing``, where the first not above the one before it is; -1
    when neither (one compiled pass: ``kernels.index.first_bad_id``)."""
    if not len(ids):
        return -1
    low, high = ANY_ID if rows is None else (0, rows - 1)
    return int(FIRST_BAD_ID(np.ascontiguousarray(ids).reshape(-1), low, high, increasing))


DENSE_INDEX_ROWS = 1 << 22  # up to here a direct index: 4 B a row of the table (16 MiB at most)
BUCKET_BITS = 6


class RowIndex:
    """Where a shard's rows are: ``index[query]`` gives each queried id's position in the
    sorted ``ids`` the shard owns, -1 for ids owned elsewhere or out of range.

    A shard holding the whole table needs no index: row i is at position i (the query itself is
    the answer when every id is in range; a view, not to be written to).

    A table of at most ``DENSE_INDEX_ROWS`` rows gets a direct index (one int32 per row of
    the table, -1 elsewhere; one gather per lookup). A larger one gets buckets of
    ``2**BUCKET_BITS`` consecutive ids: where each bucket's owned ids start (4 B per 64 rows of
    the table), then a binary search inside the bucket (at most 7 rounds, each
    touching one cache line per id), so a shard's memory grows with its own rows. Lookups are
    compiled loops (``kernels.index``)."""

    def __init__(self, ids: np.ndarray, rows: int):
        self.ids, self.rows = ids, rows
        small = np.int32 if len(ids) < 2**31 else np.int64
        self.direct: Optional[np.ndarray] = None
        self.starts: Optional[np.ndarray] = None
        self.whole = len(ids) == rows  # sorted unique ids below rows: all of them, row i at position i
        if self.whole:
            return
        if rows <= DENSE_INDEX_ROWS:
            self.direct = np.full(rows, -1, dtype=small)
            self.direct[ids] = np.arange(len(ids))
        else:
            edges = np.arange(0, rows + (1 << BUCKET_BITS), 1 << BUCKET_BITS, dtype=ids.dtype)
            self.starts = np.searchsorted(ids, edges).astype(small)  # edges of the ids' dtype: no copy of ids

    def __getitem__(self, query) -> np.ndarray:
        """The positions (int64) of the ``query`` ids, -1 for ids not here: one compiled pass."""
        query = np.ascontiguousarray(query, dtype=np.int64)
        if self.whole:
            inside = first_bad_id(query, self.rows) < 0
            return query if inside else np.where((query >= 0) & (query < self.rows), query, -1)
        if self.direct is not None:
            return DIRECT_POSITIONS(self.direct, query.reshape(-1)).reshape(query.shape)
        if not len(self.ids):
            return np.full(query.shape, -1, dtype=np.int64)
        return BUCKET_POSITIONS(self.starts, self.ids, query.reshape(-1), self.rows, BUCKET_BITS).reshape(query.shape)
