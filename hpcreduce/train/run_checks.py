"""Every check a run makes inside its job before it trains, agreed by all ranks in one allgather.

What each rank can only see for itself travels in that one message: rank 0's disk against the
output files and the checkpoint folder (rank 0 writes them), the node a rank runs on (a
``--kill-node`` naming no node of the job can never fire), its part of the data set's files
(``Dataset.problems``: each rank checks one part), and whether it has a GPU (``device="gpu"``).
Every rank then words the same problems. A rank that joined a running job checks only the
settings and its own GPU: the job it joins made the other checks, and it takes part in no
collective the job does not make. ``hpcreduce train`` runs this once per launch, then trains
without checking again (``api.run_checked``); ``train()`` runs both. Ring mode's memory check
(``refuse_unfit_replicas``) comes later, from the trainer, once its optimizer is chosen.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..errors import ConfigurationError, Problem, SettingProblem, setting_problem, worded
from ..ft.inject import unknown_node_problem
from ..ps.footprint import refuse_unfit_problems, unfit_problem
from ..ps.optimizers import Optimizer
from ..runtime.context import Context
from ..runtime.devices import gpu_verdict, local_gpu_problem
from ..runtime.memory import available_bytes
from ..runtime.nodes import rank_nodes, this_node
from .config import TrainConfig
from .data import Dataset
from .model import Model


@dataclass
class RunProblems:
    """``settings``: what stops the run (a ``ConfigurationError``); ``device``: a GPU missing
    somewhere (a ``GpuUnavailableError``)."""

    settings: List[Problem] = field(default_factory=list)
    device: Optional[SettingProblem] = None

    def all(self) -> List[Problem]:
        return self.settings + ([self.device] if self.device else [])


@dataclass
class _Seen:
    """What one rank sees for itself (pickled into the allgather)."""

    outputs: List[SettingProblem]
    node: str
    data: List[Problem]
    gpu: Optional[str]


def run_problems(config: TrainConfig, ctx: Context, dataset: Optional[Dataset]) -> RunProblems:
    """The problems of running ``config`` on ``ctx``'s ranks with ``dataset`` (None: no data
    set to check); the same on every rank. Collective: one allgather (none on a newcomer)."""
    found = RunProblems(list(config.problems(ctx.size, ctx.ft)))
    gpu = local_gpu_problem() if config.device == "gpu" else None
    if ctx.joined:
        found.device = gpu_verdict([gpu], agreed=False)
        return found
    mine = _Seen(config.output_problems() if ctx.rank == 0 and config.writes_files() else [],
                 this_node() if config.fault.node_kills else "", _data_problems(dataset, ctx), gpu)
    seen: List[_Seen] = ctx.comm.allgather(mine)
    found.settings += seen[0].outputs
    if config.fault.node_kills:
        unknown = unknown_node_problem(config.fault.node_kills, [rank.node for rank in seen])
        found.settings += [setting_problem("{node_kills}: %s" % unknown)] if unknown else []
    found.settings += _distinct(problem for rank in seen for problem in rank.data)
    if config.device == "gpu":
        found.device = gpu_verdict([rank.gpu for rank in seen], agreed=True)
    return found


def _data_problems(dataset: Optional[Dataset], ctx: Context) -> List[Problem]:
    """This rank's part of the data set's check; an error in it is a problem, told to every rank
    (a rank raising alone would leave the others waiting)."""
    if dataset is None:
        return []
    try:
        return dataset.problems(ctx.rank, ctx.size)
    except Exception as err:
        return [f"checking data set {dataset.name!r} failed on rank {ctx.rank}: {type(err).__name__}: {err}"]


def _distinct(problems) -> List[Problem]:
    """``problems`` without repeats (several ranks may find the same), in order."""
    seen, found = set(), []
    for problem in problems:
        if worded(problem) not in seen:
            seen.add(worded(problem))
            found.append(problem)
    return found


def refuse_unfit_replicas(ctx: Context, model: Model, optimizer: Optimizer) -> None:
    """Ring mode: ``ConfigurationError`` on every rank, before any parameter is allocated, if the
    ranks of some node cannot hold the model: each rank holds every parameter whole (sparse tables
    too) with its optimizer state, its summed gradient and that gradient's fusion buffer, a lower
    bound of what it takes (``ps.footprint``'s check, worded alike). Collective: two allgathers."""
    nodes = rank_nodes(ctx.comm)
    here = nodes.count(nodes[ctx.rank])
    values = sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize for spec in model.param_specs())
    need = here * values * (3 + len(optimizer.state_names))
    problem = unfit_problem(f"the ranks' memory: the {here} rank(s)", nodes[ctx.rank], need, available_bytes(),
                            f"each: every parameter whole, its {optimizer.name} state, the summed gradient and "
                            "its fusion buffer", "use --mode ps (its servers shard the tables), more nodes, "
                            "or fewer table rows (--table-rows)")
    refuse_unfit_problems(ctx.comm, problem, ConfigurationError)
