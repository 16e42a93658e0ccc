"""An embedding model for click data, as DLRM builds one: embeddings, their pairwise dot
products, and a top MLP.

Parameters: two dynamic sparse tables keyed by any int64 feature id (one for all fields:
the ids are already salted by field), ``embeddings`` (``dim`` floats an id) and ``linear``
(one weight an id, starting at zero), and the dense top MLP. For an example with ids
``x_1..x_F`` (``batch["ids"]``, one row an example, one id a field) and embeddings ``e_i``:

    z      = [<e_i, e_j> for i < j]                      (F(F-1)/2 dot products)
    logit  = b + sum_i linear(x_i) + z @ a + relu(z @ W1 + b1) @ w2

``a`` (the interactions' linear read-out) starts at ones, so the model starts as a
factorisation machine and the MLP (``W1``, Glorot; ``w2``, zeros) learns what the sum
misses. Loss: summed binary cross-entropy against ``batch["label"]``. Cost per example:
O(F^2 * dim + F^2 * hidden).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List

import numpy as np

from ...arrays import array_module
from ...ps.tables import Dynamic, dynamic_table
from ..model import Model, Params, ParamSpec, SparseRows, StepOutput
from .logreg import lookup, sigmoid

INIT_STREAM = 0x5EED_0005
DENSE = ("bias", "interaction_weights", "w1", "b1", "w2")


class EmbeddingModel(Model):
    """Embeddings of ``dim`` per id, their pairwise dot products over ``fields`` fields, and a
    top MLP of ``hidden`` relu units; ``dynamic``: how the tables' rows come and go on the
    servers (the embeddings start N(0, ``dynamic.init_scale**2``), the linear weights at 0)."""

    name = "embed"

    def __init__(self, fields: int, dim: int = 8, hidden: int = 16,
                 dynamic: Dynamic = Dynamic(), dtype: str = "float32"):
        if fields < 2 or dim < 1 or hidden < 1:
            raise ValueError(f"the embedding model needs fields >= 2, dim >= 1 and hidden >= 1, "
                             f"got {fields}, {dim} and {hidden}")
        self.fields, self.dim, self.hidden, self.dtype = fields, dim, hidden, dtype
        self.dynamic = dynamic
        self.pairs = np.triu_indices(fields, k=1)

    def param_specs(self) -> List[ParamSpec]:
        pairs = len(self.pairs[0])
        return [dynamic_table("embeddings", self.dim, self.dynamic, self.dtype),
                dynamic_table("linear", 1, dataclasses.replace(self.dynamic, init_scale=0.0), self.dtype),
                ParamSpec("bias", (1,), self.dtype),
                ParamSpec("interaction_weights", (pairs,), self.dtype),
                ParamSpec("w1", (pairs, self.hidden), self.dtype),
                ParamSpec("b1", (self.hidden,), self.dtype),
                ParamSpec("w2", (self.hidden,), self.dtype)]

    def init_params(self, seed: int) -> Dict[str, np.ndarray]:
        """The dense parameters only (a dynamic table's rows start at ``initial_rows``):
        ``a`` ones, ``W1`` Glorot-uniform, the rest zeros."""
        rng = np.random.default_rng([seed, INIT_STREAM])
        params = {spec.name: np.zeros(spec.shape, spec.dtype) for spec in self.param_specs() if not spec.sparse}
        params["interaction_weights"][:] = 1.0
        limit = np.sqrt(6.0 / sum(params["w1"].shape))
        params["w1"][:] = rng.uniform(-limit, limit, params["w1"].shape)
        return params

    def rows(self, batch) -> Dict[str, np.ndarray]:
        ids = np.unique(np.asarray(batch["ids"]))
        return {"embeddings": ids, "linear": ids}

    def loss_and_grads(self, params: Params, batch) -> StepOutput:
        embeddings, linear = params["embeddings"], params["linear"]
        bias, a, w1, b1, w2 = (params[name] for name in DENSE)
        xp = array_module(embeddings.values)
        ids = xp.asarray(batch["ids"])
        if ids.ndim != 2 or ids.shape[1] != self.fields:
            raise ValueError(f"the embed model has {self.fields} fields, so a batch's ids must be "
                             f"(examples, {self.fields}); got shape {tuple(ids.shape)}")
        labels = xp.asarray(batch["label"]).astype(embeddings.values.dtype)
        rows, inverse = xp.unique(ids.reshape(-1), return_inverse=True)
        inverse = inverse.reshape(ids.shape)
        vectors = embeddings.values[lookup(embeddings, rows, "embeddings")][inverse]  # (b, F, dim)
        weights = linear.values[lookup(linear, rows, "linear"), 0]
        left, right = self.pairs
        gram = vectors @ vectors.transpose(0, 2, 1)  # (b, F, F)
        z = gram[:, left, right]  # (b, pairs)
        pre = z @ w1 + b1
        hidden = xp.maximum(pre, 0.0)
        logits = bias[0] + weights[inverse].sum(axis=1) + z @ a + hidden @ w2
        loss_sum = float((xp.logaddexp(0.0, logits) - labels * logits).sum())
        residual = sigmoid(xp, logits) - labels  # d loss / d logit
        d_pre = residual[:, None] * w2 * (pre > 0)
        d_z = residual[:, None] * a + d_pre @ w1.T
        d_gram = xp.zeros_like(gram)
        d_gram[:, left, right] = d_z
        d_vectors = (d_gram + d_gram.transpose(0, 2, 1)) @ vectors  # (b, F, dim)
        flat = inverse.reshape(-1)
        columns = (flat[:, None] * self.dim + xp.arange(self.dim)).reshape(-1)  # one bincount sums every row
        row_grads = xp.bincount(columns, weights=d_vectors.reshape(-1), minlength=len(rows) * self.dim)
        linear_grads = xp.bincount(flat, weights=xp.repeat(residual, self.fields), minlength=len(rows))
        grads = {"embeddings": SparseRows(rows, row_grads.reshape(len(rows), self.dim).astype(vectors.dtype)),
                 "linear": SparseRows(rows, linear_grads[:, None].astype(linear.values.dtype)),
                 "bias": residual.sum(keepdims=True), "interaction_weights": z.T @ residual,
                 "w1": z.T @ d_pre, "b1": d_pre.sum(axis=0), "w2": hidden.T @ residual}
        correct = int(((logits > 0) == (labels > 0.5)).sum())
        return StepOutput(loss_sum, grads, correct, len(labels))
