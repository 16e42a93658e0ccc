"""Logistic regression on hashed sparse features: the parameter server's home ground.

Parameters: a sparse table ``weights`` (one row per hashed feature id, one column)
and a dense ``bias``. An example is the list of its active ids (``batch["ids"]``,
one row per example, binary features; an id twice in a row counts twice) and a
0/1 ``batch["label"]``. Loss: summed binary cross-entropy of
``logit = bias + sum of weights[ids]``.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from ...arrays import array_module
from ..model import Model, Params, ParamSpec, SparseRows, StepOutput


def sigmoid(xp, z):
    """1 / (1 + exp(-z)) without overflow."""
    return 0.5 * (xp.tanh(0.5 * z) + 1.0)


def lookup(table: SparseRows, ids, name: str):
    """Positions of ``ids`` among the rows ``table`` holds (each must be there)."""
    xp = array_module(table.values)
    table_ids = xp.asarray(table.ids)
    position = xp.minimum(xp.searchsorted(table_ids, ids), max(len(table_ids) - 1, 0))
    if len(ids) and (len(table_ids) == 0 or bool((table_ids[position] != ids).any())):
        raise ValueError(f"the rows given for {name!r} lack ids the batch touches")
    return position


class LogisticRegression(Model):
    """Binary logistic regression over ``2**hash_bits`` hashed feature ids."""

    name = "logreg"

    def __init__(self, hash_bits: int = 20, dtype: str = "float32"):
        self.hash_bits, self.dtype = hash_bits, dtype

    def param_specs(self) -> List[ParamSpec]:
        return [ParamSpec("weights", (1 << self.hash_bits, 1), self.dtype, sparse=True),
                ParamSpec("bias", (1,), self.dtype)]

    def init_params(self, seed: int) -> Dict[str, np.ndarray]:
        """Zeros: the loss is convex, and zeros are what sparse tables start from."""
        return {spec.name: np.zeros(spec.shape, spec.dtype) for spec in self.param_specs()}

    def init_elements(self, seed: int, name: str, flat: np.ndarray) -> np.ndarray:
        """The initial values of elements ``flat`` of parameter ``name`` (zeros), so that a
        parameter server makes only its own rows (``hpcreduce.ps.init``)."""
        return np.zeros(len(flat), self.dtype)

    def rows(self, batch) -> Dict[str, np.ndarray]:
        return {"weights": np.unique(np.asarray(batch["ids"]))}

    def loss_and_grads(self, params: Params, batch) -> StepOutput:
        table, bias = params["weights"], params["bias"]
        xp = array_module(table.values)
        ids = xp.asarray(batch["ids"])
        labels = xp.asarray(batch["label"]).astype(table.values.dtype)
        rows, inverse = xp.unique(ids.reshape(-1), return_inverse=True)
        inverse = inverse.reshape(ids.shape)
        weights = table.values[lookup(table, rows, "weights"), 0]
        logits = weights[inverse].sum(axis=1) + bias[0]
        loss_sum = float((xp.logaddexp(0.0, logits) - labels * logits).sum())
        residual = sigmoid(xp, logits) - labels  # d loss / d logit
        row_grads = xp.bincount(inverse.reshape(-1), weights=xp.repeat(residual, ids.shape[1]),
                                minlength=len(rows)).astype(table.values.dtype)
        correct = int(((logits > 0) == (labels > 0.5)).sum())
        grads = {"weights": SparseRows(rows, row_grads[:, None]),
                 "bias": residual.sum(keepdims=True).astype(bias.dtype)}
        return StepOutput(loss_sum, grads, correct, len(labels))
