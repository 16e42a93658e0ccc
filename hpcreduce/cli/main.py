"""The ``hpcreduce`` command: one subcommand per module, each with ``register`` and ``run``."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import mpi4py

# Start MPI only in the commands that run as ranks (after a relaunch under mpirun), not
# in every command: a singleton MPI_Init costs a second and prints nothing useful.
mpi4py.rc.initialize = False
mpi4py.rc.finalize = True

from ..errors import HpcreduceError  # noqa: E402
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
        _end_without_finalize_under_ulfm(1)
        return 1


def _end_without_finalize_under_ulfm(code: int) -> None:
    """Inside a job launched with ULFM, end this process with ``code`` at once, without
    MPI_Finalize: after ranks were lost (and others spawned), Open MPI 5.0.11's MPI_Finalize
    shrinks the world in a collective that waits for ranks that are gone, and the job hung
    (hybrid, --replace, then the last server lost: 4 runs in 8). The errors ending a job are
    raised on every rank alike, so no rank is left waiting for this one."""
    if "mpi4py.MPI" not in sys.modules:
        return
    from mpi4py import MPI
    from ..runtime.environment import ft_enabled
    if MPI.Is_initialized() and not MPI.Is_finalized() and ft_enabled(MPI):
        sys.stdout.flush()
        sys.stderr.flush()
        _peers_done(MPI)
        os._exit(code)


def _peers_done(MPI, limit_s: float = 10.0) -> None:
    """Wait (an ``Ibarrier`` over the job's current communicator, at most ``limit_s``) until
    every rank has printed its error too: a process that ends without MPI_Finalize may have
    mpirun end the others before they do. A failure of the barrier ends the wait."""
    from ..runtime.context import current
    ctx = current()
    if ctx is None:
        return
    try:
        request = ctx.comm.Ibarrier()
        deadline = time.monotonic() + limit_s
        while not request.Test() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # this rank's last barrier messages leave before it ends (else a peer reports a lost one)
    except MPI.Exception:
        pass


def _where() -> str:
    """`` on rank R of N`` inside an MPI job, else nothing."""
    if "mpi4py.MPI" not in sys.modules:
        return ""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    return f" on rank {world.Get_rank()} of {world.Get_size()}" if MPI.Is_initialized() else ""
