"""``hpcreduce train``: train a built-in model data-parallel, by ring AllReduce or parameter server.

Outside an MPI job it relaunches itself under mpirun on -n ranks; under mpirun or
srun it runs as one rank of the job. Rank 0 prints progress (a bar on a terminal, else
a line every ~10% of the steps; --quiet: none) and a final line with the held-out loss
and accuracy; --json writes the whole result, --metrics one JSON line per step,
--timeline a Chrome trace of every rank's phases.
Flag errors are printed by rank 0 and every rank exits with status 2.
Each model brings the --steps, --batch, --lr and --optimizer it trains well with;
flags override them. --mode sandblaster minimises the batch objective with --optimizer
lbfgs (default) or gd over K servers, one coordinator and the other ranks as workers,
for at most --steps iterations (default 100).
"""
from __future__ import annotations

import argparse
import sys
import traceback
from typing import TYPE_CHECKING, List, Tuple

from ..errors import Problem
from .checks import growth_slots_problem, launch_problems, refuse, setting_problems
from .fault_flags import add_fault_flags, fault_config
from .flags import flag_names
from .ranks import add_rank_options, outside_mpi, relaunch

if TYPE_CHECKING:
    from ..train.config import TrainConfig

TUNABLE = ("steps", "batch", "lr", "optimizer")


def register(subcommands) -> None:
    parser = subcommands.add_parser(
        "train", help="train a model over MPI ranks (ring AllReduce or parameter server)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(parser)
    parser.add_argument("--mode", default="ring", metavar="MODE", help="ring (every rank a worker), ps or sandblaster (default ring)")
    parser.add_argument("--servers", type=int, default=1, metavar="K", help="ps: server ranks K (default 1)")
    parser.add_argument("--consistency", default="bsp", metavar="C", help="ps: bsp, ssp or asp (default bsp)")
    parser.add_argument("--staleness", type=int, default=0, metavar="S", help="ps with ssp: clocks a worker may run ahead")
    parser.add_argument("--fetch-every", type=int, default=1, metavar="N", help="ps with asp: pull every n steps")
    parser.add_argument("--push-every", type=int, default=1, metavar="N", help="ps with asp: push every n steps")
    parser.add_argument("--model", default="logreg", metavar="NAME",
                        help="logreg (sparse hashed features, synthetic clicks; default) or "
                             "mlp (scikit-learn digits)")
    parser.add_argument("--data", metavar="DIR",
                        help="train on the .npy shards of data directory DIR (hpcreduce data write makes one; "
                             "each worker opens only its shards) instead of the model's built-in data")
    parser.add_argument("--table-rows", dest="table_rows", type=int, metavar="R",
                        help="logreg: rows of the hashed feature table, a power of two (default 2**20)")
    parser.add_argument("--wire-dtype", dest="wire_dtype", default="float32", metavar="DTYPE",
                        help="ps: float32 or float16, how pushed and pulled values travel (the servers keep "
                             "float32; default float32)")
    parser.add_argument("--model-dir", dest="model_dir", metavar="DIR",
                        help="ps: each server writes its shard of the trained model here, plus a manifest "
                             "(hpcreduce export DIR assembles it)")
    parser.add_argument("--steps", type=int, metavar="S", help="training steps (default: the model's)")
    parser.add_argument("--batch", type=int, metavar="B", help="global batch per step, split over the workers "
                                                  "(default: the model's)")
    parser.add_argument("--lr", type=float, metavar="X", help="learning rate (default: the model's)")
    parser.add_argument("--optimizer", metavar="NAME", help="sgd, momentum, adagrad or adam (default: the model's); "
                                                            "sandblaster: lbfgs (default) or gd")
    parser.add_argument("--device", default="cpu", metavar="cpu|gpu",
                        help="cpu (numpy) or gpu (cupy; each rank takes GPU local rank %% GPUs; ring and ps "
                             "modes; default cpu)")
    parser.add_argument("--seed", type=int, default=0, metavar="SEED", help="seed of data, initial parameters and "
                                                            "batch order (default 0)")
    parser.add_argument("--json", dest="json_path", metavar="PATH",
                        help="write per-step metrics and the final result here (rank 0)")
    parser.add_argument("--progress", default="auto", metavar="HOW",
                        help="bar (redrawn in place), lines (every ~10%% of the steps), none, or auto: "
                             "a bar when stdout is a terminal, else lines (default auto)")
    parser.add_argument("--quiet", dest="progress", action="store_const", const="none",
                        help="no progress output (same as --progress none)")
    parser.add_argument("--metrics", dest="metrics_path", metavar="PATH",
                        help="write one JSON object per step here as the run goes (JSON lines)")
    parser.add_argument("--timeline", dest="timeline_path", metavar="PATH",
                        help="write every rank's compute/communication/wait phases here "
                             "(Chrome trace JSON, gathered to rank 0 at the end)")
    add_sandblaster_flags(parser)
    add_fault_flags(parser)
    parser.set_defaults(run=run, flags=flag_names(parser))


def add_sandblaster_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sandblaster (--mode sandblaster)")
    group.add_argument("--unit", type=int, metavar="N", help="examples per work unit (default: batch / (8 x workers))")
    group.add_argument("--history", type=int, default=10, metavar="M", help="L-BFGS memory: (s, y) pairs (default 10)")
    group.add_argument("--backups", default="on", metavar="on|off", help="backup tasks near the end of a pass "
                                                                         "(default on)")
    group.add_argument("--gtol", type=float, default=1e-6, metavar="X", help="stop when ||gradient|| <= X "
                                                                            "(default 1e-6)")
    group.add_argument("--ftol", type=float, default=1e-10, metavar="X",
                       help="stop when an iteration lowers the objective by <= X relative (default 1e-10)")
    group.add_argument("--l2", type=float, default=1e-4, metavar="X", help="weight of 0.5 ||x||^2 in the objective "
                                                                          "(default 1e-4)")
    group.add_argument("--push-units", type=int, default=4, metavar="N",
                       help="a worker pushes its gradients every N units kept (default 4)")


def run(args: argparse.Namespace, argv: List[str]) -> int:
    if outside_mpi():  # the launcher: refuse bad flags, settings and paths before any rank starts
        problems = launcher_problems(args)
        return refuse("train", problems, 0, args.flags) if problems else relaunch(args, argv)
    config, problems = build_config(args)
    from mpi4py import MPI
    from ..errors import FaultToleranceUnavailableError, HpcreduceError
    from ..runtime.context import init
    from ..runtime.launch import mark_done
    from ..train.api import config_problems
    try:
        ctx = init(ft=True if args.ft else None)
    except FaultToleranceUnavailableError as err:
        return refuse("train", [str(err)], MPI.COMM_WORLD.Get_rank(), args.flags)
    problems += [*config_problems(config, ctx), *setting_problems(), *_ulfm_problems(config, ctx.ft)]
    if config.device == "gpu":  # every rank checks its own GPU; all agree (a newcomer checks alone)
        from ..runtime.devices import gpu_problem
        problems += [found for found in [gpu_problem(None if ctx.joined else ctx.comm)] if found]
    if config.data and not ctx.joined:  # every rank checks a part of the shards; all agree
        from ..train.data_dir import agreed_problems
        problems += agreed_problems(ctx, _data_dir(config))
    if problems:
        return refuse("train", problems, ctx.rank, args.flags)
    try:
        from ..train import train
        from ..train.models import build
        model, dataset = build(config.model, config.seed, config.table_rows, config.data)
        if ctx.rank == 0:
            print(f"hpcreduce train: {model.name} on {dataset.name} "
                  f"({dataset.size('train')} train / {dataset.size('test')} test examples), "
                  f"{config.mode} over {ctx.size} ranks, {config.steps} steps of {config.batch}, "
                  f"{config.optimizer}" + ("" if config.mode == "sandblaster" else f" lr {config.lr}"), flush=True)
        train(model, dataset, config, comm=ctx)
    except HpcreduceError:  # raised on every rank alike: main reports it, every rank exits 1
        raise
    except Exception:  # may be this rank's alone, and would leave the others waiting: end the job
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    if ctx.rank == 0:
        mark_done()  # the result is written: a launcher seeing mpirun fail after this does not rerun
    return 0


def launcher_problems(args: argparse.Namespace) -> List[Problem]:
    """Everything wrong with a launch of ``args.ranks`` ranks, found before any starts."""
    config, problems = build_config(args)
    problems += [*config.problems(args.ranks, args.ft), *config.output_problems(), *launch_problems(args),
                 *setting_problems(), *_ulfm_problems(config, args.ft)]
    if config.data:
        problems += _data_dir(config).problems(0, 1)
    grown = growth_slots_problem(args, sum(n for n, _ in [*config.fault.grow, *config.fault.grow_servers]))
    return problems + ([grown] if grown else [])


def build_config(args: argparse.Namespace) -> Tuple["TrainConfig", List[Problem]]:
    """The TrainConfig the flags ask for (model defaults filled in) and the flags that do not parse."""
    from ..train.config import TrainConfig
    from ..train.models import BUILTIN
    builtin = BUILTIN.get(args.model)
    chosen = {name: getattr(args, name) for name in TUNABLE if getattr(args, name) is not None}
    fault, problems = fault_config(args)
    defaults = dict(builtin.defaults if builtin else {})
    if args.mode == "sandblaster":  # a batch method: the model's SGD settings do not apply
        defaults.update(steps=100, optimizer="lbfgs")
    if args.backups not in ("on", "off"):
        problems.append(f"--backups must be on or off, got {args.backups!r}")
    config = TrainConfig(mode=args.mode, model=args.model, seed=args.seed, servers=args.servers,
                         consistency=args.consistency, staleness=args.staleness,
                         fetch_every=args.fetch_every, push_every=args.push_every, table_rows=args.table_rows,
                         model_dir=args.model_dir, data=args.data, wire_dtype=args.wire_dtype,
                         json_path=args.json_path, progress=args.progress, metrics_path=args.metrics_path,
                         timeline_path=args.timeline_path, fault=fault, unit=args.unit, history=args.history,
                         backups=args.backups != "off", gtol=args.gtol, ftol=args.ftol, l2=args.l2,
                         push_units=args.push_units, device=args.device, **{**defaults, **chosen})
    if builtin is None:
        problems.append(f"--model must be one of {', '.join(BUILTIN)}, got {args.model!r}")
    return config, problems


def _data_dir(config: "TrainConfig"):
    """The data directory --data names, as the model reads it (its manifest read, nothing else)."""
    from ..train.data_dir import DirDataset
    from ..train.models import BUILTIN
    builtin = BUILTIN.get(config.model)
    return DirDataset(config.data, builtin.reads if builtin else ())


def _ulfm_problems(config: "TrainConfig", ft: bool) -> List[str]:
    if config.fault.needs_ulfm() and not ft and config.mode != "ps":  # ps: TrainConfig.problems says it
        return ["--kill, --kill-random, --grow, --discover and --replace need in-job fault "
                "tolerance: launch with --ft (ULFM), or give --checkpoint-dir and "
                "--restarts to recover kills by relaunching"]
    return []
