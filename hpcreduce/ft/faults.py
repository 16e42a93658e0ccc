"""Fault-tolerance settings of a run: injected failures, growth, checkpoints, deadlines."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ..errors import SettingProblem, setting_problem
from .resize import GrowthRule
from .inject import Kill, KillSchedule, NodeKill, hostfile_node_problem


@dataclass
class FaultConfig:
    """``kills``: (rank, step[, phase]) to SIGKILL; ``kill_random``: probability of one random
    kill per step; ``node_kills``: (node, step[, phase]) to SIGKILL every rank of a node; ``grow``: (count, step) growth; ``leave``: (stable id, step) graceful
    departures; ``discover``: file holding the wanted number of ranks or ``HOST[:SLOTS]``
    lines, polled between steps (``ft.resize``); ``hostfile``: the launch's hostfile (hosts
    the discovery file may name); ``grow_servers``: (count, step) PS shard servers added;
    ``replace``: spawn a replacement per lost rank;
    ``checkpoint_dir``/``checkpoint_every``: periodic checkpoints (the fallback without
    ULFM, resumed when the job is relaunched); ``deadline_s``: longest blocking wait (None: ``HPCREDUCE_DEADLINE``, else 120 s);
    ``slow``: (rank id, factor) stragglers, whose compute takes factor times as long (``train.straggler``);
    ``accept_server_loss``: a PS run with one server and no checkpoint may start under ULFM (its
    server's death then ends the job)."""

    kills: List[Kill] = field(default_factory=list)
    kill_random: float = 0.0
    kill_seed: Optional[int] = None
    grow: List[Tuple[int, int]] = field(default_factory=list)
    leave: List[Tuple[int, int]] = field(default_factory=list)
    grow_servers: List[Tuple[int, int]] = field(default_factory=list)
    discover: Optional[str] = None
    discover_every: int = 1
    replace: bool = False
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    deadline_s: Optional[float] = None
    slow: List[Tuple[int, float]] = field(default_factory=list)
    accept_server_loss: bool = False
    hostfile: Optional[str] = None
    node_kills: List[NodeKill] = field(default_factory=list)

    def needs_ulfm(self) -> bool:
        """Whether the run can only go on in-job (ULFM): kills without checkpoints, growth."""
        return bool(self.grow or self.grow_servers or self.leave or self.discover or self.replace
                    or ((self.kills or self.kill_random or self.node_kills) and not self.checkpoint_dir))

    def hangs_only(self) -> bool:
        """Whether every injected failure is a hang (``:hang``): no ULFM needed, the deadline ends the job."""
        return bool(self.kills) and not self.kill_random and all(kill.phase == "hang" for kill in self.kills)

    def problems(self, steps: Optional[int] = None, ranks: Optional[int] = None, ft: bool = True,
                 recovery_kills_wait: bool = False) -> List[SettingProblem]:
        """What is wrong with these settings, by field name (empty when fine). Given the run's
        ``steps`` and its starting ``ranks`` (``ft``: with ULFM), also every kill or growth
        that could never happen; ``recovery_kills_wait``: a ``:recovery`` kill fires in the
        first recovery at or after its step (PS), not only in one at its step (ring)."""
        found = []
        if not 0 <= self.kill_random < 1:
            found.append(setting_problem("{kill_random} must be in [0, 1), got {value}", value=self.kill_random))
        if self.checkpoint_every < 0 or self.discover_every < 1:
            found.append(setting_problem("{checkpoint_every} must be >= 0 and {discover_every} >= 1"))
        if self.checkpoint_every and not self.checkpoint_dir:
            found.append(setting_problem("{checkpoint_every} needs {checkpoint_dir}"))
        if self.deadline_s is not None and not 0 < self.deadline_s < float("inf"):
            found.append(setting_problem("{deadline_s} must be positive, got {value}", value=self.deadline_s))
        found += self._slow_problems(ranks)
        found += self._leave_problems(steps, ranks)
        if steps is not None:
            found += [setting_problem("{grow} %d@%d: STEP must be from 1 to %d ({steps})" % (n, at, steps))
                      for n, at in self.grow if not 1 <= at <= steps]
            found += [setting_problem("{grow_servers} %d@%d: STEP must be from 1 to %d ({steps})" % (n, at, steps))
                      for n, at in self.grow_servers if not 1 <= at <= steps]
            found += [setting_problem("{kills} %s: %s" % (_spelled(kill), why))
                      for kill in self.kills for why in [self._kill_problem(kill, steps, ranks, ft, recovery_kills_wait)]
                      if why]
            found += [setting_problem("{node_kills} %s@%d: STEP must be from 1 to %d ({steps})"
                                      % (kill.node, kill.step, steps)) for kill in self.node_kills
                      if not 1 <= kill.step <= steps]
        unknown_node = hostfile_node_problem(self.node_kills, self.hostfile)
        if unknown_node:
            found.append(setting_problem("{node_kills}: %s" % unknown_node))
        return found

    def _slow_problems(self, ranks: Optional[int]) -> List[SettingProblem]:
        """Stragglers that cannot be: a factor below 1 or not finite, a rank slowed twice, a
        rank id that is not one of the job's starting ranks (``ranks``, when known)."""
        found, seen = [], set()
        for rank, factor in self.slow:
            why = None
            if not 1 <= factor < math.inf:
                why = f"FACTOR must be >= 1 and finite, got {factor}"
            elif rank in seen:
                why = f"rank {rank} is slowed twice"
            elif rank < 0 or (ranks is not None and rank >= ranks):
                why = f"no rank has id {rank}: the job starts with ranks 0..{ranks - 1}" if ranks else \
                      f"RANK must be >= 0, got {rank}"
            seen.add(rank)
            if why:
                found.append(setting_problem("{slow} %d:%g: %s" % (rank, factor, why)))
        return found

    def _leave_problems(self, steps: Optional[int], ranks: Optional[int]) -> List[SettingProblem]:
        """Departures that cannot be: a step outside 1..``steps``, an id that never exists
        (the rule of ``--kill`` ids), an id leaving twice, every rank leaving (or killed)."""
        found, seen = [], set()
        most = self._most_ids(ranks)
        for identity, at in self.leave:
            why = None
            if steps is not None and not 1 <= at <= steps:
                why = "STEP must be from 1 to %d ({steps})" % steps
            elif most is not None and identity >= most:
                why = "no rank has id %d: the job has ids 0..%d (its ranks, then any that join)" % (identity, most - 1)
            elif identity in seen:
                why = "rank %d leaves twice" % identity
            seen.add(identity)
            if why:
                found.append(setting_problem("{leave} %d@%d: %s" % (identity, at, why)))
        gone = seen | {kill.rank for kill in self.kills if kill.phase != "hang"}
        if self.leave and most is not None and gone >= set(range(most)):
            found.append(setting_problem("{leave}: every rank of the job (ids 0..%d) leaves%s: none would be left "
                                         "to finish it" % (most - 1, " or is killed" if self.kills else "")))
        return found

    def _kill_problem(self, kill: Kill, steps: int, ranks: Optional[int], ft: bool, waits: bool) -> Optional[str]:
        """Why ``kill`` could never fire in a run of ``steps`` steps from ``ranks`` ranks, or None."""
        if not 1 <= kill.step <= steps:
            return "STEP must be from 1 to %d ({steps})" % steps
        most = self._most_ids(ranks)
        if most is not None and kill.rank >= most:
            return "no rank has id %d: the job has ids 0..%d (its ranks, then any that join)" % (kill.rank, most - 1)
        if kill.phase == "checkpoint" and not (self.checkpoint_dir and self.checkpoint_every
                                               and kill.step % self.checkpoint_every == 0):
            return "no checkpoint is written at step %d: give {checkpoint_dir} and a {checkpoint_every} " \
                   "that divides it" % kill.step
        if kill.phase == "recovery" and not self._recovery_possible(kill, ft, waits):
            return "no recovery can happen at step %d: a recovery follows a failure of another rank (a kill " \
                   "at that step, or {kill_random}) in a job with in-job fault tolerance (--ft)" % kill.step
        return None

    def _most_ids(self, ranks: Optional[int]) -> Optional[int]:
        """How many stable ids the job can ever have (None: unbounded or unknown)."""
        if ranks is None or self.discover or (self.replace and (self.kill_random or self.node_kills)):
            return None
        return ranks + sum(n for n, _ in [*self.grow, *self.grow_servers]) + (len(self.kills) if self.replace else 0)

    def _recovery_possible(self, kill: Kill, ft: bool, waits: bool) -> bool:
        """Whether some recovery can strike ``kill`` (a ``:recovery`` kill)."""
        if not ft:
            return False
        if 0 < self.kill_random < 1:
            return True
        failing = {other.step + (other.phase == "checkpoint") for other in self.kills
                   if other.rank != kill.rank and other.phase in ("step", "checkpoint")}
        if waits:
            failing |= {at for _, at in self.grow}
            return any(at >= kill.step for at in failing) or bool(self.discover)
        return kill.step in failing

    @property
    def growth(self) -> GrowthRule:
        """When the job grows (``grow`` entries and the discovery file)."""
        return GrowthRule(tuple(self.grow), self.discover, self.discover_every, tuple(self.leave))

    def schedule(self, seed: int, protected: Sequence[int] = (0,)) -> KillSchedule:
        """The kill schedule; random kills draw from ``kill_seed``, else the run's ``seed``,
        and never pick the ids in ``protected``."""
        return KillSchedule(self.kills, self.kill_random, seed if self.kill_seed is None else self.kill_seed,
                            protected, self.node_kills)


def _spelled(kill: Kill) -> str:
    """A kill as ``--kill`` spells it."""
    return f"{kill.rank}@{kill.step}" + ("" if kill.phase == "step" else f":{kill.phase}")


def parse_slow(text: str) -> Tuple[int, float]:
    """``RANK:FACTOR``: (rank id, factor); whether they fit the job is ``problems``'s to say."""
    try:
        rank, factor = text.split(":")
        return int(rank), float(factor)
    except ValueError:
        raise ValueError(f"{text!r}: expected RANK:FACTOR, e.g. 1:4 (rank 1 computes 4x as long)") from None
