"""What a Sandblaster worker computes: a model's summed loss and gradient over one work unit."""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from ..data import Dataset
from ..model import Model, checked_grads
from ..params import batch_view
from ..straggler import slow_down
from .flat import FlatParams


class ModelUnits:
    """Unit u is examples ``indices[u*unit:(u+1)*unit]`` of the training split; a straggler
    (``slow``: its factor, 1.0 when not) runs each unit's compute (not its first read of the
    examples) under ``train.straggler.slow_down``.
    The batch is fixed, so each unit's examples and the rows they touch are read once and kept
    (every later pass computes on them again): at most the whole batch per worker."""

    def __init__(self, model: Model, dataset: Dataset, flat: FlatParams, indices: np.ndarray, unit: int,
                 slow: float = 1.0):
        self.model, self.dataset, self.flat = model, dataset, flat
        self.indices, self.unit_size, self.slow = indices, unit, slow
        self.params: Dict[str, np.ndarray] = {}
        self.kept: Dict[int, Tuple[Any, Dict[str, Any]]] = {}

    def load(self, x: np.ndarray) -> None:
        self.params = self.flat.params(x)

    def _examples(self, unit: int) -> Tuple[Any, Dict[str, Any]]:
        """Unit ``unit``'s batch and the rows it touches, read at its first use."""
        if unit not in self.kept:
            batch = self.dataset.batch("train", self.indices[unit * self.unit_size:(unit + 1) * self.unit_size])
            self.kept[unit] = (batch, self.model.rows(batch))
        return self.kept[unit]

    def unit(self, unit: int, out: np.ndarray) -> Tuple[float, float, float]:
        batch, rows = self._examples(unit)  # reading is not compute: a straggler reads at full speed
        with slow_down(self.slow):
            output = self.model.loss_and_grads(batch_view(self.model, self.params, batch, rows), batch)
            self.flat.add(checked_grads(self.model, self.flat.specs, output), out)
        return float(output.loss_sum), float(output.correct), float(output.count)
