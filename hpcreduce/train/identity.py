"""The identity of a training run: what a checkpoint is only valid for.

A checkpoint of another run (another model or shapes, optimizer, seed, batch, learning
rate, PS consistency...) would resume a different computation, so it is refused by name
(``ft.checkpoint_files.identity_problem``), never restored. Left out, because they change
where the work runs but not its result: ``steps`` (a longer run may resume a shorter
one's checkpoint), the number of ranks and of PS servers (checkpoints are restored onto
any placement), the checkpoint and fault-injection settings, and the output files.
"""
from __future__ import annotations

import dataclasses
from typing import Dict

from ..ps.optimizers import Optimizer
from .config import TrainConfig
from .model import Model


def run_identity(config: TrainConfig, model: Model, optimizer: Optimizer) -> Dict[str, object]:
    """The settings and shapes of this run (training with ``optimizer``) that a checkpoint
    must share to be resumed."""
    identity: Dict[str, object] = {
        "mode": config.mode, "model": model.name,
        "parameters": {spec.name: {"shape": list(spec.shape), "dtype": spec.dtype, "sparse": spec.sparse,
                                   **({"dynamic": dataclasses.asdict(spec.dynamic)} if spec.dynamic else {})}
                       for spec in model.param_specs()},
        "optimizer": config.optimizer,
        "optimizer state": list(optimizer.state_names),
        "seed": config.seed, "batch": config.batch, "lr": config.lr}
    if config.has_servers:
        identity.update({"consistency": config.topology.consistency, "staleness": config.topology.staleness,
                         "fetch_every": config.topology.fetch_every, "push_every": config.topology.push_every})
    if config.mode == "hybrid":  # the servers' tables, in their order (the rest live on the workers)
        identity["server tables"] = [spec.name for spec in model.param_specs() if spec.sparse]
    return identity
