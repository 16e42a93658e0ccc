"""What a Sandblaster worker computes: a model's summed loss and gradient over one work unit."""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from ..data import Dataset
from ..model import Model, checked_grads
from ..params import batch_view
from ..straggler import slow_down
from .flat import FlatParams


class ModelUnits:
    """Unit u is examples ``indices[u*unit:(u+1)*unit]`` of the training split; a straggler
    (``slow``: its factor, 1.0 when not) runs each unit's compute under ``train.straggler.slow_down``."""

    def __init__(self, model: Model, dataset: Dataset, flat: FlatParams, indices: np.ndarray, unit: int,
                 slow: float = 1.0):
        self.model, self.dataset, self.flat = model, dataset, flat
        self.indices, self.unit_size, self.slow = indices, unit, slow
        self.params: Dict[str, np.ndarray] = {}

    def load(self, x: np.ndarray) -> None:
        self.params = self.flat.params(x)

    def unit(self, unit: int, out: np.ndarray) -> Tuple[float, float, float]:
        with slow_down(self.slow):
            batch = self.dataset.batch("train", self.indices[unit * self.unit_size:(unit + 1) * self.unit_size])
            output = self.model.loss_and_grads(batch_view(self.model, self.params, batch), batch)
            self.flat.add(checked_grads(self.model, self.flat.specs, output), out)
        return float(output.loss_sum), float(output.correct), float(output.count)
