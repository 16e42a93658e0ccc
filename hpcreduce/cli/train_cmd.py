"""``hpcreduce train``: train a built-in model data-parallel, by ring AllReduce or parameter server.

Outside an MPI job it relaunches itself under mpirun on -n ranks; under mpirun or
srun it runs as one rank of the job. Rank 0 prints progress (a bar on a terminal, else
a line every ~10% of the steps; --quiet: none) and a final line with the held-out loss
and accuracy; --json writes the whole result, --metrics one JSON line per step,
--timeline a Chrome trace of every rank's phases.
Flag errors are printed by rank 0 and every rank exits with status 2; a run that ends with a
model worse than the one it started from (diverged: see the final line's warning) exits 5
(3 is the deadline watchdog's abort). Every mode, with --ft or not, stops at the next step boundary
(sandblaster: after the iteration) on SIGUSR1 or SIGTERM (--stop-signals), writes its checkpoint into
--checkpoint-dir and exits 75: started again over the folder it goes on (docs/slurm.md).
Each model brings the --steps, --batch, --lr and --optimizer it trains well with;
flags override them. --mode sandblaster minimises the batch objective with --optimizer
lbfgs (default) or gd over K servers, one coordinator and the other ranks as workers,
for at most --steps iterations (default 100), with each model's batch-method defaults
(logreg: --batch 131072 --table-rows 262144 --l2 5e-5 --steps 30; mlp: --batch 1438).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from typing import TYPE_CHECKING, Dict, List, Tuple

from ..errors import Problem
from .checks import growth_slots_problem, launch_problems, refuse, setting_problems
from .config_flags import add_flags, given
from .flags import flag_names
from .ranks import add_rank_options, outside_mpi, relaunch

if TYPE_CHECKING:
    from ..train.config import TrainConfig


def register(subcommands) -> None:
    from ..ft.faults import FaultConfig
    from ..train.config import MODES, PS, Sandblaster, TrainConfig
    parser = subcommands.add_parser(
        "train", help="train a model over MPI ranks (ring AllReduce or parameter server)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(parser)
    parser.add_argument("--mode", default=argparse.SUPPRESS, metavar="MODE",
                        help=f"{', '.join(MODES[:-1])} or {MODES[-1]}: every rank a worker, parameter servers, "
                             "sparse tables on servers with dense parameters allreduced among the workers, "
                             "or DistBelief's batch procedure (default ring)")
    add_flags(parser, TrainConfig)
    parser.add_argument("--quiet", dest="progress", action="store_const", const="none", default=argparse.SUPPRESS,
                        help="no progress output (same as --progress none)")
    add_flags(parser.add_argument_group("parameter server (--mode ps and hybrid)"), PS)
    add_flags(parser.add_argument_group("sandblaster (--mode sandblaster)"), Sandblaster, skip=("--servers",))
    add_flags(parser.add_argument_group("fault tolerance and growth (in-job recovery needs --ft)"), FaultConfig)
    parser.set_defaults(run=run, flags=flag_names(parser))


def run(args: argparse.Namespace, argv: List[str]) -> int:
    if outside_mpi():  # the launcher: refuse bad flags, settings and paths before any rank starts
        problems = launcher_problems(args)
        return refuse("train", problems, 0, args.flags) if problems else relaunch(args, stop_signals(args, argv))
    config, problems = build_config(args)
    from ..runtime.stop import STOP_SIGNALS, StoppedEarly, requests
    # a signal held since the start (``hold_early``) stays; one not in --stop-signals acts as without the hold
    requests.install(STOP_SIGNALS.value() if config.fault.stop_signals is None else config.fault.stop_signals)
    from mpi4py import MPI
    from ..errors import FaultToleranceUnavailableError, HpcreduceError
    from ..runtime.context import init
    from ..runtime.failures import abort_job
    from ..runtime.launch import mark_done
    from ..train.divergence import DIVERGED_EXIT
    from ..train.api import run_checked  # the trainers, loaded before MPI starts: a spawned rank joins sooner
    from ..train.config import DYNAMIC_MODELS
    from ..train.models import build
    from ..train.run_checks import run_problems
    try:
        ctx = init(ft=True if args.ft else None)
    except FaultToleranceUnavailableError as err:
        return refuse("train", [str(err)], MPI.COMM_WORLD.Get_rank(), args.flags)
    problems += setting_problems() + run_problems(config, ctx, _data_dir(config) if config.data else None).all()
    if problems:
        return refuse("train", problems, ctx.rank, args.flags)
    try:
        model, dataset = build(config.model, config.seed, config.table_rows, config.data,
                               config.dynamic() if config.model in DYNAMIC_MODELS else None)
        if ctx.rank == 0:
            print(f"hpcreduce train: {model.name} on {dataset.name} "
                  f"({dataset.size('train')} train / {dataset.size('test')} test examples), "
                  f"{config.mode} over {ctx.size} ranks, {config.steps} steps of {config.batch}, "
                  f"{config.optimizer}" + ("" if config.mode == "sandblaster" else f" lr {config.lr}"), flush=True)
        result = run_checked(ctx, model, dataset, config)
    except StoppedEarly as stopped:  # every rank, after the same step: checkpointed (exit 75) or not
        if ctx.rank == 0:
            print(f"hpcreduce train: {stopped}", file=sys.stderr, flush=True)
            mark_done(stopped.code)
        return stopped.code
    except HpcreduceError:  # raised on every rank alike: main reports it, every rank exits 1
        raise
    except Exception:  # may be this rank's alone, and would leave the others waiting: end the job
        traceback.print_exc()
        sys.stderr.flush()
        abort_job(1)
    code = DIVERGED_EXIT if result.diverged and result.diverged["worse_than_start"] else 0
    if ctx.rank == 0:
        mark_done(code)  # the result is written: the launcher returns this code and does not rerun
    return code


def stop_signals(args: argparse.Namespace, argv: List[str]) -> List[str]:
    """``argv``; the launcher catches the stop signals ``--stop-signals`` gives (``runtime.stop``)."""
    from ..runtime.settings import reload
    from ..runtime.stop import STOP_SIGNALS
    config, _ = build_config(args)
    if config.fault.stop_signals is not None:
        os.environ[STOP_SIGNALS.name] = ",".join(s.name[3:] for s in config.fault.stop_signals) or "none"
        reload()
    return argv


def launcher_problems(args: argparse.Namespace) -> List[Problem]:
    """Everything wrong with a launch of ``args.ranks`` ranks, found before any starts."""
    config, problems = build_config(args)
    problems += [*config.problems(args.ranks, args.ft), *config.output_problems(), *launch_problems(args),
                 *setting_problems()]
    if config.data:
        problems += _data_dir(config).problems(0, 1)
    grown = growth_slots_problem(args, sum(n for n, _ in [*config.fault.grow, *config.fault.grow_servers]))
    return problems + ([grown] if grown else [])


def build_config(args: argparse.Namespace) -> Tuple["TrainConfig", List[Problem]]:
    """The TrainConfig the flags ask for and the flags that do not parse or do not fit the
    mode. Defaults: the field's, then the model's usual settings, then the mode's (a batch
    method's), then the model's for a batch method (``Builtin.batch_method``), then the flags."""
    from ..ft.faults import FaultConfig
    from ..train.config import MODES, TOPOLOGIES, Ring, TrainConfig
    from ..train.models import BUILTIN
    problems: List[Problem] = []
    mode = getattr(args, "mode", "ring")
    if mode not in TOPOLOGIES:
        problems.append(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    topology = TOPOLOGIES.get(mode, Ring)
    shared, unparsed = given(args, TrainConfig)
    part, unparsed_part = given(args, topology)
    fault, unparsed_fault = given(args, FaultConfig)
    problems += unparsed + unparsed_part + unparsed_fault + _other_modes(args, mode)
    builtin = BUILTIN.get(getattr(args, "model", "logreg"))
    if builtin is None:
        problems.append(f"--model must be one of {', '.join(BUILTIN)}, got {args.model!r}")
    batch_method = dict(builtin.batch_method) if builtin and mode == "sandblaster" else {}
    if "data" in shared:  # a data directory's ids were hashed for the model's usual table
        batch_method.pop("table_rows", None)
    own = {f.name for f in dataclasses.fields(topology)}
    chosen = {**(builtin.defaults if builtin else {}), **topology.defaults,
              **{name: value for name, value in batch_method.items() if name not in own}, **shared}
    part = {**{name: value for name, value in batch_method.items() if name in own}, **part}
    config = TrainConfig(**chosen, topology=topology(**part), fault=FaultConfig(**fault, hostfile=args.hostfile))
    return config, problems


def _other_modes(args: argparse.Namespace, mode: str) -> List[str]:
    """The flags given that belong to other modes only, each named with the modes it applies to
    (a value that changes nothing, the field's default, is let through)."""
    from ..runtime.options import declared, default_of
    from ..train.config import TOPOLOGIES
    modes_of: Dict[str, List[str]] = {}
    flags: Dict[str, str] = {}
    for name, kind in TOPOLOGIES.items():
        values, _ = given(args, kind)
        for f, option in declared(kind):
            modes_of.setdefault(f.name, []).append(name)
            if hasattr(args, f.name) and values.get(f.name) != default_of(f):  # given: a value that parses, or not
                flags[f.name] = option.flag
    return [f"{flag} only applies to --mode {_listed(modes_of[name])}" for name, flag in flags.items()
            if mode not in modes_of[name]]


def _listed(names: List[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def _data_dir(config: "TrainConfig"):
    """The data directory --data names, as the model reads it (its manifest read, nothing else)."""
    from ..train.data_dir import DirDataset
    from ..train.models import BUILTIN
    builtin = BUILTIN.get(config.model)
    return DirDataset(config.data, builtin.reads if builtin else ())
