"""Held-out loss and accuracy of whole parameters, the test set split over the ranks."""
from __future__ import annotations

from typing import Mapping, Tuple

import numpy as np

from ..collectives import allreduce
from ..runtime.context import Context
from .data import Dataset
from .model import Model
from .params import batch_view
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
