"""The training state a ring rank carries from step to step.

Parameters, optimizer slots and the number of steps done are all a rank needs to go
on: the fault-tolerance layer commits a copy of it, restores it after a failed step,
and syncs it to ranks that join, much as Horovod's elastic ``State`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..collectives.arrays import array_module
from .model import Model
from .optimizers import Optimizer


@dataclass
class TrainState:
    """``params``: whole tensors and tables by name; ``slots``: each parameter's optimizer
    state arrays; ``step``: steps completed (the next step's index, from 0)."""

    params: Dict[str, object]
    slots: Dict[str, Dict[str, object]]
    step: int = 0

    @classmethod
    def initial(cls, model: Model, optimizer: Optimizer, seed: int) -> "TrainState":
        """The model's initial parameters and zeroed optimizer state."""
        params = model.init_params(seed)
        missing = [spec.name for spec in model.param_specs() if spec.name not in params]
        if missing:
            raise ValueError(f"{model.name}.init_params gave no value for {', '.join(missing)}")
        return cls(params, {name: optimizer.init_state(value) for name, value in params.items()})

    def arrays(self) -> List[Tuple[str, object]]:
        """Every array of the state, named, in an order all ranks share (to sync or save it)."""
        named = [(name, self.params[name]) for name in sorted(self.params)]
        named += [(f"{name}/{slot}", self.slots[name][slot])
                  for name in sorted(self.slots) for slot in sorted(self.slots[name])]
        return named

    def copy(self) -> "TrainState":
        """A deep copy (a commit point to restore after a failed step)."""
        def clone(x):
            return array_module(x).array(x, copy=True)
        return TrainState({name: clone(value) for name, value in self.params.items()},
                          {name: {slot: clone(value) for slot, value in slots.items()}
                           for name, slots in self.slots.items()},
                          self.step)
