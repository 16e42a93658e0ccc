"""Options shared by subcommands that need ranks, and their self-launch under mpirun."""
from __future__ import annotations

import argparse
from typing import Sequence

from ..runtime.environment import detect_launcher
from ..runtime.launch import build_mpirun, run_plan, self_command

DEFAULT_RANKS = 4


def add_rank_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--ranks", type=int, default=DEFAULT_RANKS,
                        help="ranks to start when run outside an MPI job (default %(default)s); "
                             "under mpirun or srun the job's size is used")
    parser.add_argument("--ft", action="store_true",
                        help="fault tolerance: launch with ULFM (mpirun --with-ft ulfm, tcp transport)")
    parser.add_argument("--hostfile", help="Open MPI hostfile for the self-launch")
    parser.add_argument("--restarts", type=int, default=0, metavar="R",
                        help="relaunch a failed job up to R times (resuming from --checkpoint-dir)")


def outside_mpi() -> bool:
    """Whether this process runs outside any MPI job (then it launches one)."""
    return detect_launcher() == "none"


SPREAD_SERVERS = ("--map-by", "node")
"""mpirun's mapping for modes whose first ranks are servers: rank r on node r mod nodes, so the
servers (and a shard's replica, on the next server) sit on different nodes."""


def relaunch(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Rerun this command under mpirun on ``args.ranks`` ranks; its exit code (a job whose rank 0
    did not mark it done, ``mark_done``, did not finish). With a hostfile, the parameter-server
    modes spread their ranks over the nodes (``SPREAD_SERVERS``)."""
    spread = bool(args.hostfile) and getattr(args, "mode", None) in ("ps", "hybrid", "sandblaster")
    plan = build_mpirun(args.ranks, self_command(argv), ft=args.ft, hostfile=args.hostfile,
                        extra_args=SPREAD_SERVERS if spread else ())
    return run_plan(plan, restarts=args.restarts, expects_done=True)
