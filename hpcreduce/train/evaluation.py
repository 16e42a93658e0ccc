"""Held-out loss and accuracy of whole parameters, the test set split over the ranks; and of
the initial model (``evaluate_initial``: made row by row, so a sharded table is never whole)."""
from __future__ import annotations

from typing import Dict, Mapping, Tuple

import numpy as np

from ..collectives import allreduce
from ..runtime.context import Context
from .data import Dataset
from .model import Model
from ..ps.init import PartInit
from ..ps.tables import ParamSpec, initial_rows, numel
from .params import batch_view, part_init
from .partition import share_bounds

EVAL_CHUNK = 8192


def evaluate_examples(model: Model, params: Mapping[str, object], dataset: Dataset,
                      indices: np.ndarray, split: str = "test") -> np.ndarray:
    """float64 [loss_sum, correct, count] of whole ``params`` over examples ``indices``,
    in chunks of ``EVAL_CHUNK`` (gradients computed and dropped)."""
    stats = np.zeros(3)
    for start in range(0, len(indices), EVAL_CHUNK):
        batch = dataset.batch(split, indices[start:start + EVAL_CHUNK])
        output = model.loss_and_grads(batch_view(model, params, batch), batch)
        stats += (output.loss_sum, output.correct, output.count)
    return stats


def evaluate(ctx: Context, model: Model, params: Mapping[str, object],
             dataset: Dataset) -> Tuple[float, float]:
    """Mean loss and accuracy on the whole test split; every rank holds the same
    ``params`` and evaluates its contiguous share of the examples."""
    start, stop = share_bounds(dataset.size("test"), ctx.rank, ctx.size)
    stats = evaluate_examples(model, params, dataset, np.arange(start, stop))
    loss_sum, correct, count = allreduce(stats, "sum", comm=ctx)
    return float(loss_sum / count), float(correct / count)


class InitialRows:
    """A sparse table's initial values, row by row: ``table[ids]`` makes only rows ``ids``
    (a dynamic table's from its declaration, ``ps.tables.initial_rows``, as the servers do)."""

    def __init__(self, init: PartInit, table: int, spec: ParamSpec):
        self.init, self.table, self.spec = init, table, spec

    def __getitem__(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        return initial_rows(self.spec, ids) if self.spec.dynamic is not None else self.init.rows(self.table, ids)


def initial_params(model: Model, seed: int) -> Dict[str, object]:
    """The parameters every mode starts from (``params.part_init``): dense ones whole, sparse
    tables as ``InitialRows``."""
    specs = model.param_specs()
    init = part_init(model, seed, specs)
    return {spec.name: InitialRows(init, table, spec) if spec.sparse else
            init.dense(table, 0, numel(spec)).reshape(spec.shape) for table, spec in enumerate(specs)}


def evaluate_initial(ctx: Context, model: Model, dataset: Dataset, seed: int) -> Tuple[float, float]:
    """``evaluate`` of the initial model (collective): what training must improve on."""
    return evaluate(ctx, model, initial_params(model, seed), dataset)
