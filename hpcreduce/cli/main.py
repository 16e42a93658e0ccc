"""The ``hpcreduce`` command: one subcommand per module, each with ``register`` and ``run``."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import mpi4py

# Start MPI only in the commands that run as ranks (after a relaunch under mpirun), not
# in every command: a singleton MPI_Init costs a second and prints nothing useful.
mpi4py.rc.initialize = False
mpi4py.rc.finalize = True

from ..errors import HpcreduceError  # noqa: E402
from ..runtime.ulfm_exit import end_without_finalize  # noqa: E402
from . import bench_cmd, data_cmd, export_cmd, info_cmd, launch_cmd, report_cmd, train_cmd  # noqa: E402

COMMANDS = (info_cmd, launch_cmd, bench_cmd, train_cmd, data_cmd, report_cmd, export_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcreduce",
        description="Data-parallel training over MPI ranks: ring AllReduce or parameter server.")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subcommands)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args, argv) or 0)
    except HpcreduceError as err:  # settings named by field are shown with the command's flags
        print(f"hpcreduce {args.command}: error{_where()}: {err.render(getattr(args, 'flags', {}))}",
              file=sys.stderr, flush=True)
        end_without_finalize(1)  # under ULFM: no MPI_Finalize (runtime.ulfm_exit)
        return 1


def _where() -> str:
    """`` on rank R of N`` inside an MPI job, else nothing."""
    if "mpi4py.MPI" not in sys.modules:
        return ""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    return f" on rank {world.Get_rank()} of {world.Get_size()}" if MPI.Is_initialized() else ""
