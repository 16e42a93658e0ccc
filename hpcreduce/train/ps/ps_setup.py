"""What stays the same through a PS training run, on every rank: one value the PS trainer's
parts read (``ps_driver``, ``fallback``, recovery and growth), never change. In ``--mode
hybrid`` the servers' tables are the model's sparse ones only (the dense parameters live on
the workers: ``dense_replica``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Tuple

from ...errors import PSConfigError, SettingProblem, setting_problem
from ...ft.faults import FaultConfig
from ...ps.consistency import Consistency
from ...ps.roles import Tables
from ..config import PS, TrainConfig
from ..data import Dataset
from ..identity import run_identity
from ..model import Model


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
