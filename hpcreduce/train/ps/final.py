"""The end of a PS run without the whole model on any rank: initial values per shard,
held-out evaluation, the checksum, the memory report.

- ``initial_shards``: a server makes only its own elements when the model has
  ``init_elements(seed, name, flat)`` (logreg); otherwise the whole tables are made once
  and sliced (a model small enough for that; ``params.part_init``).
- ``evaluate_sharded``: every rank evaluates its share of the test split with the dense
  tables and the rows its examples touch, fetched from their servers (``ps.gather.fetch_rows``).
- ``sharded_checksum``: each server sums its own pieces and rows exactly (``results.exact_sum``);
  the parts add up to exactly ``results.checksum`` of the whole model.
- ``final_params``: the whole model when it is at most ``WHOLE_BYTES`` (what a caller of
  ``train`` usually wants), else this rank's part.
- ``memory_report``: every rank's peak RSS and role.
Cost: the dense tables broadcast once; the rows the test split touches; the servers'
arrays read once (in chunks of ``CHUNK`` elements) for the checksum.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...ps.gather import fetch_rows, gather_params
from ...ps.init import CHUNK
from ...ps.layout import Layout
from ...ps.shard_state import ShardState
from ...ps.tables import ParamSpec, numel
from ...runtime.context import Context
from ...runtime.memory import peak_rss_bytes
from ..data import Dataset
from ..evaluation import EVAL_CHUNK, evaluate_examples
from ..model import Model, SparseRows
from ..params import part_init
from ..partition import share_bounds
from ..results import checksum_terms, exact_float, exact_sum
from .ps_setup import PSSetup

WHOLE_BYTES = 64 << 20


def initial_shards(setup: PSSetup, layout: Layout, keys: Sequence[int]) -> List[ShardState]:
    """The initial states of shards ``keys`` of ``layout`` (a server's own, and its replica)."""
    tables = setup.tables
    return ShardState.create_many(layout, keys, part_init(setup.model, setup.config.seed, tables.specs),
                                  tables.optimizers)


class FetchedRows:
    """Some rows of a sparse table (sorted unique ``ids``), indexed by id: ``rows[ids]``."""

    def __init__(self, ids: np.ndarray, values: np.ndarray):
        self.ids, self.values = ids, values

    def __getitem__(self, query) -> np.ndarray:
        return self.values[np.searchsorted(self.ids, np.asarray(query))]


def evaluate_sharded(ctx: Context, model: Model, dataset: Dataset, layout: Layout,
                     state: Optional[ShardState], dense: Mapping[str, np.ndarray]) -> Tuple[float, float]:
    """Mean held-out loss and accuracy; each rank evaluates its share of the test split on
    the rows it touches (collective)."""
    start, stop = share_bounds(dataset.size("test"), ctx.rank, ctx.size)
    indices = np.arange(start, stop)
    wanted: Dict[str, List[np.ndarray]] = {}
    for begin in range(0, len(indices), EVAL_CHUNK):
        for name, ids in model.rows(dataset.batch("test", indices[begin:begin + EVAL_CHUNK])).items():
            wanted.setdefault(name, []).append(np.asarray(ids, dtype=np.int64))
    params: Dict[str, object] = dict(dense)
    for table, spec in enumerate(layout.specs):
        if spec.sparse:
            ids = np.unique(np.concatenate(wanted.get(spec.name, []) or [np.empty(0, np.int64)]))
            params[spec.name] = FetchedRows(ids, fetch_rows(ctx.comm, layout, state, table, ids))
    stats = evaluate_examples(model, params, dataset, indices)
    ctx.comm.Allreduce(MPI.IN_PLACE, stats, op=MPI.SUM)
    loss_sum, correct, count = stats
    return float(loss_sum / count), float(correct / count)


def sharded_checksum(comm: MPI.Intracomm, layout: Layout, state: Optional[ShardState],
                     extra: Mapping[str, np.ndarray] = {}) -> float:  # noqa: B006 (read only)
    """``results.checksum`` of the whole model, from each server's own part, plus ``extra``
    (whole tensors no server holds, the same on every rank: hybrid's dense ones) (collective)."""
    total = 0
    if comm.Get_rank() == 0:
        total = sum(exact_sum(checksum_terms(name, value)) for name, value in extra.items())
    for table, shard in (state.tables.items() if state is not None else ()):
        name = layout.specs[table].name
        width = int(np.prod(shard.values.shape[1:], dtype=np.int64)) if shard.sparse else 1
        values = shard.values.reshape(len(shard.values), width)  # a shard without rows too: a normal state
        step = max(1, CHUNK // max(width, 1))
        for begin in range(0, len(values), step):
            end = min(len(values), begin + step)
            ids = shard.ids[begin:end] if shard.sparse else np.arange(shard.start + begin, shard.start + end)
            total += exact_sum(checksum_terms(name, SparseRows(ids, values[begin:end])))
    return exact_float(sum(comm.allgather(total)))


def model_bytes(specs: Sequence[ParamSpec]) -> int:
    return sum(numel(spec) * np.dtype(spec.dtype).itemsize for spec in specs)


def final_params(comm: MPI.Intracomm, layout: Layout, state: Optional[ShardState],
                 dense: Mapping[str, np.ndarray]) -> Dict[str, Any]:
    """The whole model on every rank when it is at most ``WHOLE_BYTES``; else this rank's
    part: the dense tables and its own rows (``SparseRows``, ids as the shard keeps them;
    none on a worker); always so for a model with a dynamic table. ``dense``: every dense table,
    held by the servers or not (hybrid). Collective."""
    if model_bytes(layout.specs) <= WHOLE_BYTES and not any(spec.dynamic for spec in layout.specs):
        whole = gather_params(comm, layout, state)
        return {**whole, **{name: value for name, value in dense.items() if name not in whole}}
    params: Dict[str, Any] = dict(dense)
    for table, spec in enumerate(layout.specs):
        if spec.sparse:
            own = state.tables[table] if state is not None else None
            params[spec.name] = SparseRows(own.ids, own.values) if own is not None else \
                SparseRows(np.empty(0, np.int64), np.empty((0,) + tuple(spec.shape[1:]), spec.dtype))
    return params


def memory_report(comm: MPI.Intracomm, role: str) -> Dict[str, List[Any]]:
    """Every rank's peak resident memory so far and its role (server or worker), by rank."""
    found = comm.allgather((peak_rss_bytes(), role))
    return {"peak_rss_bytes": [peak for peak, _ in found], "roles": [role for _, role in found]}
