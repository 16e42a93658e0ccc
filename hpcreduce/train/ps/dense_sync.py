"""How a parameter-server worker keeps its dense parameters in step: a dense-sync strategy.

``ServerDense`` (``--mode ps``): the servers hold the dense tables; the worker pulls them with
the rows (NaN until the first pull: computing on never-pulled weights is refused as NaN, never
silent), pushes its summed dense gradients with the rows (a push-pull where the servers allow
it) and hands each step's share to the servers with its clock. ``DenseReplica`` (``--mode
hybrid``, ``dense_replica``): every worker keeps the dense parameters and reduces their
gradients among the workers after the push. Both answer the same questions of the worker loop.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ...ps.tables import ParamSpec
from ...ps.worker import Worker
from ...runtime.context import Context
from ..config import TrainConfig
from ..model import Model
from .dense_replica import DenseReplica


class ServerDense:
    """The dense parameters held by the servers: pulled, pushed, shared through the clock."""

    pulled = True  # the read pulls them; a push may be fused with the next pull
    reduces = False  # no reduction among the workers
    joined_with: Optional[Worker] = None

    def __init__(self, specs: List[ParamSpec]):
        self.params: Dict[str, np.ndarray] = {spec.name: np.full(spec.shape, _unset(spec.dtype), spec.dtype)
                                              for spec in specs if not spec.sparse}

    def pushes(self, summed: Dict[str, np.ndarray]) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
        """The dense gradients a push carries (every one summed since the last push) and those
        still summed after it (none)."""
        return summed, {}

    def clock_share(self, current: Tuple[np.ndarray, int]) -> Tuple[Optional[np.ndarray], int]:
        """What the clock tells the servers: the step's [loss sum, correct, count] and staleness."""
        return current

    def join(self, worker: Worker) -> None:
        """A new layout: nothing to agree among the workers."""
        self.joined_with = worker

    def bail_out(self) -> None:
        """A failed worker: the servers learn of it through the job (nothing to do here)."""

    def revoke(self) -> None:
        """No communicator of the workers' own to wake."""


DenseSync = Union[ServerDense, DenseReplica]


def dense_sync(ctx: Context, config: TrainConfig, model: Model) -> DenseSync:
    """The dense-sync strategy of ``config.mode``: a replica reduced among the workers (hybrid),
    else the servers'."""
    return DenseReplica(ctx, config, model) if config.mode == "hybrid" else ServerDense(model.param_specs())


def _unset(dtype: Any) -> Any:
    """The value of a dense parameter not pulled yet: NaN (0 for an integer table)."""
    return np.nan if np.issubdtype(np.dtype(dtype), np.floating) else 0
