"""Fault-tolerance settings of a run: injected failures, growth, checkpoints, deadlines."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from .growth import parse_grow
from .inject import Kill, KillSchedule, parse_kill
from .watchdog import DEFAULT_DEADLINE_S


@dataclass
class FaultConfig:
    """``kills``: (rank, step[, phase]) to SIGKILL; ``kill_random``: probability of one random
    kill per step; ``grow``: (count, step) growth; ``discover``: file holding the wanted
    number of ranks, polled between steps; ``replace``: spawn a replacement per lost rank;
    ``checkpoint_dir``/``checkpoint_every``: periodic checkpoints (the fallback without
    ULFM, resumed by ``--restarts``); ``deadline_s``: longest blocking wait."""

    kills: List[Kill] = field(default_factory=list)
    kill_random: float = 0.0
    kill_seed: Optional[int] = None
    grow: List[Tuple[int, int]] = field(default_factory=list)
    discover: Optional[str] = None
    discover_every: int = 1
    replace: bool = False
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    deadline_s: float = DEFAULT_DEADLINE_S

    def needs_ulfm(self) -> bool:
        """Whether the run can only go on in-job (ULFM): kills without checkpoints, growth."""
        return bool(self.grow or self.discover or self.replace
                    or ((self.kills or self.kill_random) and not self.checkpoint_dir))

    def problems(self) -> List[str]:
        found = []
        if not 0 <= self.kill_random < 1:
            found.append(f"--kill-random must be in [0, 1), got {self.kill_random}")
        if self.checkpoint_every < 0 or self.discover_every < 1:
            found.append("--checkpoint-every must be >= 0 and --discover-every >= 1")
        if self.checkpoint_every and not self.checkpoint_dir:
            found.append("--checkpoint-every needs --checkpoint-dir")
        if not self.deadline_s > 0:
            found.append(f"--deadline must be positive, got {self.deadline_s}")
        return found

    def schedule(self, seed: int, protected: Sequence[int] = (0,)) -> KillSchedule:
        """The kill schedule; random kills draw from ``kill_seed``, else the run's ``seed``,
        and never pick the ids in ``protected``."""
        return KillSchedule(self.kills, self.kill_random, seed if self.kill_seed is None else self.kill_seed,
                            protected)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The fault-tolerance flags of ``hpcreduce train``."""
    group = parser.add_argument_group("fault tolerance and growth (in-job recovery needs --ft)")
    group.add_argument("--kill", action="append", default=[], metavar="RANK@STEP[:PHASE]",
                       help="SIGKILL rank RANK at step STEP (phase step, recovery or checkpoint); repeatable")
    group.add_argument("--kill-random", type=float, default=0.0, metavar="P",
                       help="each step, kill one random rank (never rank 0) with probability P")
    group.add_argument("--kill-seed", type=int, metavar="SEED",
                       help="seed of --kill-random's draws (default: --seed)")
    group.add_argument("--grow", action="append", default=[], metavar="N@STEP",
                       help="spawn N more ranks before step STEP; repeatable")
    group.add_argument("--discover", metavar="FILE",
                       help="a file holding the wanted number of ranks, polled between steps: "
                            "the job grows to it")
    group.add_argument("--discover-every", type=int, default=1, metavar="STEPS",
                       help="poll --discover every STEPS steps (default 1)")
    group.add_argument("--replace", action="store_true",
                       help="spawn a replacement for every rank lost, keeping the job's size")
    group.add_argument("--checkpoint-dir", metavar="DIR",
                       help="write checkpoints here and resume from the latest one at start")
    group.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                       help="checkpoint every STEPS steps (needs --checkpoint-dir)")
    group.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, metavar="SECONDS",
                       help="abort the job when a blocking wait lasts longer (a hung peer; "
                            "default %(default)s, HPCREDUCE_DEADLINE)")


def from_args(args: argparse.Namespace) -> Tuple[FaultConfig, List[str]]:
    """The FaultConfig the flags ask for, and what is wrong with them."""
    problems: List[str] = []
    kills, grow = [], []
    for text in args.kill:
        try:
            kills.append(parse_kill(text))
        except ValueError as err:
            problems.append(str(err))
    for text in args.grow:
        try:
            grow.append(parse_grow(text))
        except ValueError as err:
            problems.append(str(err))
    config = FaultConfig(kills=kills, kill_random=args.kill_random, kill_seed=args.kill_seed, grow=grow, discover=args.discover,
                         discover_every=args.discover_every, replace=args.replace,
                         checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                         deadline_s=args.deadline)
    return config, problems + config.problems()
