"""Options shared by subcommands that need ranks, and their self-launch under mpirun."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

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


def relaunch_outside_mpi(args: argparse.Namespace, argv: Sequence[str]) -> Optional[int]:
    """Outside an MPI job, rerun this command under mpirun and return its exit code;
    inside one (mpirun, srun), return None and let the caller run as a rank."""
    if detect_launcher() != "none":
        return None
    if args.ranks < 1:
        print(f"hpcreduce: -n must be at least 1, got {args.ranks}", file=sys.stderr)
        return 2
    plan = build_mpirun(args.ranks, self_command(argv), ft=args.ft, hostfile=args.hostfile)
    return run_plan(plan, restarts=args.restarts)
