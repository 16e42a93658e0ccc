"""The model interface both topologies train: named parameters and a loss with gradients.

A model declares its parameters (``ParamSpec``: dense tensors, and sparse tables whose
rows are keyed by int64 ids; the parameter server's tables are declared the same way)
and computes, for a batch, the summed loss and the summed gradients.
The trainers scale gradients by 1/global_batch, so the workers' gradients add up to
the global batch's mean gradient whatever the number of workers.

Bring your own model by implementing ``Model``: see ``hpcreduce.train.models`` for two.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Union

import numpy as np

from ..ps.tables import ParamSpec


@dataclass
class SparseRows:
    """Some rows of a sparse table: unique, sorted int64 ``ids`` and their ``values``
    (``len(ids)`` x the table's row shape)."""

    ids: np.ndarray
    values: np.ndarray


Params = Mapping[str, Union[np.ndarray, SparseRows]]
Grads = Dict[str, Union[np.ndarray, SparseRows]]


@dataclass
class StepOutput:
    """What one batch gave: summed loss and gradients (not yet divided by the batch)."""

    loss_sum: float
    grads: Grads
    correct: int
    count: int
    extra: Dict[str, Any] = field(default_factory=dict)


class Model:
    """Interface of a trainable model; subclass and implement the four methods."""

    name = "model"

    def param_specs(self) -> List[ParamSpec]:
        """The parameters, in a fixed order shared by every rank."""
        raise NotImplementedError

    def init_params(self, seed: int) -> Dict[str, np.ndarray]:
        """Initial values of every parameter (whole tables), reproducible from ``seed``."""
        raise NotImplementedError

    def rows(self, batch: Any) -> Dict[str, np.ndarray]:
        """For each sparse parameter, the unique sorted ids the batch touches."""
        return {}

    def loss_and_grads(self, params: Params, batch: Any) -> StepOutput:
        """Summed loss and gradients over ``batch``. Dense parameters come as arrays,
        sparse ones as ``SparseRows`` holding at least ``rows(batch)``; sparse gradients
        are returned as ``SparseRows`` over those same ids."""
        raise NotImplementedError
