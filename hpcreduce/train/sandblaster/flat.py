"""A model's parameters as one flat float64 vector (param_specs order), as Sandblaster shards it;
the layout is ``train.reference``'s (``offsets``, ``flatten``, ``unflatten``)."""
from __future__ import annotations

from typing import Dict, Mapping

import numpy as np

from ...arrays import to_host
from ..model import Grads, Model, SparseRows
from ..reference import flatten, offsets, unflatten


class FlatParams:
    """Where each parameter lies in the flat vector; casts between it and the model's arrays."""

    def __init__(self, model: Model):
        self.specs = model.param_specs()
        self.where = offsets(self.specs)
        self.length = max((end for _, end in self.where.values()), default=0)
        self.dtypes = {spec.name: np.empty(0, spec.dtype) for spec in self.specs}

    def flatten(self, params: Mapping[str, object]) -> np.ndarray:
        """Whole parameters as one float64 vector."""
        return flatten({name: to_host(value) for name, value in params.items()}, self.specs)

    def params(self, x: np.ndarray) -> Dict[str, np.ndarray]:
        """Whole parameters in the model's shapes and dtypes from flat ``x`` (copies)."""
        return unflatten(x, self.specs, like=self.dtypes)

    def add(self, grads: Grads, out: np.ndarray) -> None:
        """Add gradients (dense arrays or ``SparseRows`` with unique ids) into flat ``out``."""
        for spec in self.specs:
            grad, (start, end) = grads[spec.name], self.where[spec.name]
            part = out[start:end].reshape(spec.shape)  # a view: adds land in out
            if isinstance(grad, SparseRows):
                part[to_host(grad.ids).astype(np.int64)] += to_host(grad.values)
            else:
                part += to_host(grad)
