"""The training state a ring rank carries from step to step.

Parameters, optimizer state and the number of steps done are all a rank needs to go
on: the ring's driver (``ring_driver``) tracks them in an ``elastic.State``, which syncs
them to the survivors and to ranks that join, and checkpoints them; ``copy`` gives a commit
point to restore by hand. Its arrays live on the run's device (numpy or cupy); the step
count on the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ...arrays import Device, array_module
from ...ps.optimizers import Optimizer
from ..model import Model

CPU = Device("cpu")


@dataclass
class TrainState:
    """``params``: whole tensors and tables by name; ``optimizer_state``: each parameter's
    optimizer state arrays; ``step``: steps completed (the next step's index, from 0)."""

    params: Dict[str, object]
    optimizer_state: Dict[str, Dict[str, object]]
    step: int = 0

    @classmethod
    def initial(cls, model: Model, optimizer: Optimizer, seed: int, device: Device = CPU,
                sharded: Optional[Callable[[Dict[str, object]], Dict[str, Dict[str, object]]]] = None) -> "TrainState":
        """The model's initial parameters, on ``device``, and zeroed optimizer state there (only this
        rank's slices, ``sharded(params)``, under ``--shard-optimizer``)."""
        params = model.init_params(seed)
        missing = [spec.name for spec in model.param_specs() if spec.name not in params]
        if missing:
            raise ValueError(f"{model.name}.init_params gave no value for {', '.join(missing)}")
        params = device.put_all(params)
        if sharded is not None:
            return cls(params, sharded(params))
        return cls(params, {name: optimizer.init_state(value) for name, value in params.items()})

    def arrays(self) -> List[Tuple[str, object]]:
        """Every array of the state, named, in an order all ranks share (to sync or save it)."""
        named = [(name, self.params[name]) for name in sorted(self.params)]
        named += [(f"{name}/{key}", self.optimizer_state[name][key])
                  for name in sorted(self.optimizer_state) for key in sorted(self.optimizer_state[name])]
        return named

    def copy(self) -> "TrainState":
        """A deep copy (a commit point to restore after a failed step)."""
        def clone(x):
            return array_module(x).array(x, copy=True)
        return TrainState({name: clone(value) for name, value in self.params.items()},
                          {name: {key: clone(value) for key, value in arrays.items()}
                           for name, arrays in self.optimizer_state.items()},
                          self.step)
