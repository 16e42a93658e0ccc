"""What stays the same through a PS training run, on every rank: one value the PS trainer's
parts read (``ps_driver``, ``fallback``, recovery and growth), never change. In ``--mode
hybrid`` the servers' tables are the model's sparse ones only (the dense parameters live on
the workers: ``dense_replica``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

import numpy as np

from ...errors import PSConfigError, SettingProblem, setting_problem
from ...ft.faults import FaultConfig
from ...ps.consistency import Consistency
from ...ps.dynamic_rows import budget_rows
from ...ps.roles import Tables
from ..config import PS, TrainConfig
from ..data import Dataset
from ..identity import run_identity
from ..model import Model
from ..partition import global_batch


@dataclass(frozen=True)
class PSSetup:
    """The settings, the model and its data, the tables the servers serve and the run's
    identity (written into its checkpoints)."""

    config: TrainConfig
    model: Model
    dataset: Dataset
    tables: Tables
    identity: Mapping[str, object]

    @classmethod
    def of(cls, config: TrainConfig, model: Model, dataset: Dataset, size: int, ft: bool) -> "PSSetup":
        """The setup of a PS run on ``size`` ranks (``ft``: with ULFM); ``PSConfigError`` on every
        rank when ``config`` cannot run there."""
        problems = config.problems(size, ft) + _model_problems(config, model) if config.has_servers else \
            [setting_problem("the parameter-server trainer needs {mode} ps or hybrid, got {mode} {value}",
                             value=config.mode)]
        if problems:
            raise PSConfigError(problems)
        ps: PS = config.topology
        served = [spec for spec in model.param_specs() if spec.sparse or config.mode == "ps"]
        tables = Tables.of(served, config.optimizer, config.lr, Consistency(ps.consistency, ps.staleness))
        short = budget_problem(config, model, dataset, tables)
        if short:
            raise PSConfigError(short)
        return cls(config, model, dataset, tables, run_identity(config, model, tables.optimizers[0]))

    @property
    def ps(self) -> PS:
        return self.config.topology

    @property
    def fault(self) -> FaultConfig:
        return self.config.fault

    @property
    def train_shards(self) -> Tuple[int, ...]:
        """The examples of each training shard (``partition``)."""
        return self.dataset.shard_sizes("train")


def _model_problems(config: TrainConfig, model: Model) -> List[SettingProblem]:
    """Hybrid puts only sparse tables on the servers: a model without any would leave them idle."""
    if config.mode == "hybrid" and not any(spec.sparse for spec in model.param_specs()):
        return [setting_problem("{mode} hybrid keeps the sparse tables on the servers and allreduces the rest; "
                                "{model} %s has no sparse table (it would be ring training with idle servers): "
                                "use {mode} ring" % model.name)]
    return []


def budget_problem(config: TrainConfig, model: Model, dataset: Dataset, tables: Tables) -> Optional[str]:
    """Why a dynamic table's budget cannot hold one step's rows on a shard (the first global
    batch's distinct ids of that table over the servers), or None."""
    bounded = [(t, spec) for t, spec in enumerate(tables.specs) if spec.dynamic is not None and spec.dynamic.budget_bytes]
    if not bounded:
        return None
    batch = dataset.batch("train", global_batch(0, config.batch, dataset.shard_sizes("train"), config.seed))
    rows = model.rows(batch)
    for t, spec in bounded:
        needed = -(-len(np.unique(rows[spec.name])) // config.topology.servers)
        held = budget_rows(spec, tables.optimizers[t])
        if held < needed:
            return (f"table {spec.name!r}: budget_bytes {spec.dynamic.budget_bytes} holds {held} rows per server, "
                    f"fewer than one step's {needed} (its batch of {config.batch} touches "
                    f"{len(np.unique(rows[spec.name]))} ids over {config.topology.servers} server(s)); "
                    f"raise the budget or lower --batch")
    return None
