"""``hpcreduce launch -n N [--ft] [--hostfile F] -- CMD ...``: print and run the mpirun line.

The ranks run in the environment hpcreduce itself runs in, as if it were activated: the
folder of this Python (a virtual environment's bin, say) comes first on their PATH, on
every node (mpirun -x PATH), so ``-- python train.py`` starts this Python, with the
packages hpcreduce was installed with, even where a bare ``python`` is another one.
"""
from __future__ import annotations

import argparse

from ..errors import LaunchError
from ..runtime.launch import build_mpirun, run_plan, this_environment
from .checks import SET_BY_LAUNCH, launch_problems, refuse, setting_problems


def register(subcommands) -> None:
    parser = subcommands.add_parser("launch", help="start a command on N ranks with mpirun",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--ranks", type=int, required=True, help="number of ranks")
    parser.add_argument("--ft", action="store_true", help="enable ULFM fault tolerance")
    parser.add_argument("--hostfile", help="Open MPI hostfile")
    parser.add_argument("--restarts", type=int, default=0, metavar="R",
                        help="relaunch the job up to R times while it fails (the fallback without ULFM: "
                             "a job with checkpoints resumes from the latest)")
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run on every rank")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, _argv) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    problems = [*launch_problems(args), *setting_problems(skip=SET_BY_LAUNCH)]
    if problems:
        return refuse("launch", problems)
    try:
        plan = build_mpirun(args.ranks, command, ft=args.ft, hostfile=args.hostfile, path_first=this_environment())
    except LaunchError as err:
        return refuse("launch", [str(err)])
    if args.dry_run:
        print(plan.shell())
        return 0
    return run_plan(plan, restarts=args.restarts)
