"""What every command checks before it starts anything: the ``HPCREDUCE_*`` settings, the
launch flags (-n, --restarts, --hostfile) and the files it will write. A problem is
printed once (by rank 0 inside a job) and every process exits with the usage status 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Mapping, Optional, Sequence

from ..collectives.allreduce import CHECK
from ..collectives.fusion import FUSION_BYTES
from ..collectives.selection import TABLE
from ..errors import LaunchError, Problem, SettingProblem, worded
from ..ft.inject import ATTEMPT, KILL_LOG
from ..ft.watchdog import DEADLINE
from ..runtime import settings
from ..runtime.places import Place, place_problems
from ..runtime.hosts import hostfile_slots, unknown_hosts
from ..runtime.launch import DONE_FILE
from ..runtime.environment import MAX_RANKS
from ..runtime.spawn import SPAWN_INFO, spawn_slots
from ..runtime.stop import STOP_SIGNALS

# Every environment setting hpcreduce reads; ``hpcreduce launch`` sets the last two itself.
SETTINGS = (CHECK, FUSION_BYTES, TABLE, DEADLINE, SPAWN_INFO, KILL_LOG, STOP_SIGNALS, ATTEMPT, DONE_FILE)
SET_BY_LAUNCH = (ATTEMPT, DONE_FILE)
USAGE_ERROR = 2


def setting_problems(skip: Sequence[settings.Setting] = ()) -> List[str]:
    """What is wrong with this process's ``HPCREDUCE_*`` settings (those in ``skip`` aside)."""
    return settings.problems(s for s in SETTINGS if s not in skip)


def launch_problems(args: argparse.Namespace) -> List[str]:
    """What stops a launch of ``args.ranks`` ranks: -n, --restarts, --hostfile."""
    found = []
    if not 1 <= args.ranks <= MAX_RANKS:
        found.append(f"-n must be from 1 to {MAX_RANKS}, got {args.ranks}")
    if args.restarts < 0:
        found.append(f"--restarts must be 0 or more, got {args.restarts}")
    if args.hostfile:
        try:
            hostfile_slots(args.hostfile)
            unknown = unknown_hosts(args.hostfile)
        except LaunchError as err:
            found.append(f"--hostfile: {err}")
        else:
            if unknown:
                found.append(f"--hostfile {args.hostfile} names {', '.join(unknown)}: no such host (the name does "
                             "not resolve); fix the hostfile, or set an ssh agent (plm_ssh_agent) that knows it")
    return found


def output_problems(paths: Mapping[str, Optional[str]]) -> List[SettingProblem]:
    """The files that could not be written, by flag (``{"--json": path}``), or that name one
    file (``runtime.places``); unset ones skipped."""
    return place_problems([Place(flag, path) for flag, path in paths.items()])


def growth_slots_problem(args: argparse.Namespace, grown: int) -> Optional[str]:
    """Growth by ``grown`` ranks past the slots spawning may use (``spawn_slots``: --hostfile's,
    unless ``HPCREDUCE_SPAWN_INFO`` is set to allow ``oversubscribe``)."""
    slots = spawn_slots(args.hostfile) if grown else None
    if slots is None or args.ranks + grown <= slots:
        return None
    return (f"--grow/--grow-servers take the job to {args.ranks + grown} ranks, past the {slots} slots of "
            f"--hostfile {args.hostfile} (spawned ranks need free slots; set {SPAWN_INFO.name} to "
            "map_by=slot:oversubscribe to oversubscribe them)")


def refuse(command: str, problems: Sequence[Problem], rank: int = 0, flags: Mapping[str, str] = {}) -> int:  # noqa: B006
    """Print the problems, with their flags, on rank 0; every rank returns the usage-error status."""
    if rank == 0:
        for problem in problems:
            print(f"hpcreduce {command}: {worded(problem, flags)}", file=sys.stderr, flush=True)
    return USAGE_ERROR
