"""``train(model, dataset, config)``: the Python entry point both topologies share.

    from hpcreduce.train import TrainConfig, train
    result = train(model, dataset, TrainConfig(steps=100, batch=64, lr=0.1))
    result.final.loss, result.params["w"], result.to_json()

Run it on every rank of an MPI job (``hpcreduce launch -n 4 -- python script.py``).
"""
from __future__ import annotations

from typing import List, Optional

from ..errors import ConfigurationError, SettingProblem, setting_problem
from ..ft.inject import unknown_node_problem
from ..runtime.context import Comm, Context, resolve
from ..runtime.devices import open_device
from ..runtime.nodes import rank_nodes
from .config import OUTPUTS, TrainConfig
from .data import Dataset
from .data_dir import agreed_problems
from .model import Model
from .observe import Observer
from .ps.ps_training import run_ps_training
from .results import TrainResult, final_line
from .ring.ring_training import run_ring_training
from .sandblaster.sandblaster_training import run_sandblaster_training


def config_problems(config: TrainConfig, ctx: Context) -> List[SettingProblem]:
    """What stops ``config`` running on ``ctx``'s ranks, the same list on every rank:
    ``config.problems``, and the output files and checkpoint folder rank 0 cannot write
    (checked by rank 0 before training rather than lost after it, and given to every rank)."""
    problems = config.problems(ctx.size, ctx.ft)
    writes = any(getattr(config, name) for name in OUTPUTS) or bool(config.fault.checkpoint_dir)
    if writes and not ctx.joined:  # a newcomer's first collective belongs to the job
        problems += ctx.comm.bcast(config.output_problems() if ctx.rank == 0 else None)
    if config.fault.node_kills and not ctx.joined:  # --kill-node: a node no rank runs on never goes down
        unknown = unknown_node_problem(config.fault.node_kills, rank_nodes(ctx.comm))
        problems += [setting_problem("{node_kills}: %s" % unknown)] if unknown else []
    return problems


def train(model: Model, dataset: Dataset, config: Optional[TrainConfig] = None, *,
          comm: Comm = None, verbose: bool = True) -> TrainResult:
    """Train ``model`` on ``dataset`` over the ranks of ``comm`` (a Context, an MPI
    intracommunicator, or None for ``hpcreduce.init()``'s); call it on every rank.

    ``config.mode`` picks the topology: ``ring`` (every rank a worker), ``ps``
    (``hpcreduce.train.ps.ps_training.run_ps_training``) or ``sandblaster`` (a batch method,
    ``hpcreduce.train.sandblaster.sandblaster_training.run_sandblaster_training``). Returns the result on every rank,
    with the trained parameters (the same on every rank; numpy arrays, whatever
    ``config.device``) in ``result.params``. On ``device="gpu"`` each rank first takes its
    GPU (``runtime.devices.open_device``; ``GpuUnavailableError`` on every rank when one lacks
    cupy or a GPU). Rank 0
    prints progress and the final line when ``verbose`` and writes ``config.json_path``
    when set. Bad settings raise ``ConfigurationError`` on every rank.
    """
    ctx = resolve(comm)
    config = config or TrainConfig()
    problems = config_problems(config, ctx)
    if not ctx.joined:  # a data directory's shards, checked by all ranks together (a newcomer's job did)
        problems += agreed_problems(ctx, dataset)
    if problems:
        raise ConfigurationError(problems)
    open_device(config.device, None if ctx.joined else ctx.comm)  # GpuUnavailableError on every rank
    observer = Observer(ctx, config, verbose=verbose, reporter=config.servers if config.mode != "ring" else 0)
    if config.mode == "ps":
        result = run_ps_training(ctx, config, model, dataset, observer)
    elif config.mode == "sandblaster":
        result = run_sandblaster_training(ctx, config, model, dataset, observer)
    else:
        result = run_ring_training(ctx, config, model, dataset, observer)
    result.nodes = rank_nodes(ctx.comm)
    observer.echo(final_line(result))
    observer.finish(result.to_json)  # writes config.json_path on rank 0
    return result
