"""``train(model, dataset, config)``: the Python entry point every topology shares.

    from hpcreduce.train import PS, TrainConfig, train
    result = train(model, dataset, TrainConfig(steps=100, batch=64, lr=0.1))
    result = train(model, dataset, TrainConfig(steps=100, batch=64, topology=PS(servers=2)))
    result.final.loss, result.params["w"], result.to_json()

Run it on every rank of an MPI job (``hpcreduce launch -n 4 -- python script.py``).
"""
from __future__ import annotations

from typing import Optional

from ..errors import ConfigurationError, GpuUnavailableError
from ..runtime.context import Comm, Context, resolve
from ..runtime.devices import open_device
from ..runtime.nodes import rank_nodes
from ..runtime.ulfm_exit import end_at_exit
from .config import TrainConfig
from .data import Dataset
from .divergence import judge
from .model import Model
from .observe import Observer
from .ps.ps_training import run_ps_training
from .results import TrainResult, final_line
from .ring.ring_training import run_ring_training
from .run_checks import run_problems
from .sandblaster.sandblaster_training import run_sandblaster_training

DYNAMIC_MODES = ("ps", "hybrid")
RUNNERS = {"ring": run_ring_training, "ps": run_ps_training, "hybrid": run_ps_training,
           "sandblaster": run_sandblaster_training}


def train(model: Model, dataset: Dataset, config: Optional[TrainConfig] = None, *,
          comm: Comm = None, verbose: bool = True) -> TrainResult:
    """Train ``model`` on ``dataset`` over the ranks of ``comm`` (a Context, an MPI
    intracommunicator, or None for ``hpcreduce.init()``'s); call it on every rank.

    ``config.topology`` picks how: ``Ring()`` (every rank a worker), ``PS(...)``
    (``train.ps.ps_training``) or ``Sandblaster(...)`` (a batch method,
    ``train.sandblaster.sandblaster_training``). Returns the result on every rank, with the
    trained parameters (the same on every rank; numpy arrays, whatever ``config.device``) in
    ``result.params``. Bad settings raise ``ConfigurationError`` on every rank; on
    ``device="gpu"`` a rank without cupy or a GPU makes every rank raise ``GpuUnavailableError``.
    Rank 0 prints progress and the final line when ``verbose`` and writes ``config.json_path``.
    A run that diverged says so in the final line and in ``result.diverged`` (``train.divergence``).
    Under ULFM a run that raises ends this process when the script exits, without MPI_Finalize
    (``runtime.ulfm_exit``: after lost ranks it waited for them and hung).
    """
    ctx = resolve(comm)
    config = config or TrainConfig()
    found = run_problems(config, ctx, dataset)
    if found.settings:
        raise ConfigurationError(found.settings)
    if found.device:
        raise GpuUnavailableError(found.device)
    return run_checked(ctx, model, dataset, config, verbose=verbose)


def run_checked(ctx: Context, model: Model, dataset: Dataset, config: TrainConfig, *,
                verbose: bool = True) -> TrainResult:
    """``train`` once ``run_checks.run_problems`` found nothing (``hpcreduce train`` checks first)."""
    dynamic = [spec.name for spec in model.param_specs() if spec.dynamic is not None]
    if dynamic and config.mode not in DYNAMIC_MODES:
        raise ConfigurationError(f"model {model.name!r} has dynamic table(s) {dynamic} (rows keyed by any id, "
                                 f"held only by parameter servers); train it with --mode "
                                 f"{' or '.join(DYNAMIC_MODES)}, not {config.mode}")
    open_device(config.device)  # this rank's GPU, on device="gpu"
    observer = Observer(ctx, config, verbose=verbose, reporter=config.servers)
    try:
        result = RUNNERS[config.mode](ctx, config, model, dataset, observer)
        result.nodes = rank_nodes(ctx.comm)
        judge(ctx, model, dataset, result)  # every mode's result: diverged, or worse than its start?
        observer.echo(final_line(result))
        observer.finish(result.to_json)  # writes config.json_path on rank 0
    except Exception:
        end_at_exit(ctx)  # ULFM: MPI_Finalize after lost ranks hangs; the CLI ends at once instead
        raise
    return result
