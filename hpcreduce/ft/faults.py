"""Fault-tolerance settings of a run: injected failures, growth, checkpoints, deadlines."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import SettingProblem, setting_problem
from ..runtime.environment import MAX_RANKS
from ..runtime.options import Bound, at_least, field_problems, option, partner_problems, positive_finite
from ..runtime.stop import STOP_SIGNALS, parse_signals
from .checkpoint_files import MAX_STEP
from .inject import Kill, KillSchedule, NodeKill, hostfile_node_problem, parse_kill, parse_kill_node
from .resize import GrowthRule, parse_grow, parse_leave

FT = "ft"
"""What a setting ``needs`` when it works only in-job (ULFM, ``--ft``): a setting of the launch."""


def parse_slow(text: str) -> Tuple[int, float]:
    """``RANK:FACTOR``: (rank id, factor); whether they fit the job is ``problems``'s to say."""
    try:
        rank, factor = text.split(":")
        return int(rank), float(factor)
    except ValueError:
        raise ValueError(f"{text!r}: expected RANK:FACTOR, e.g. 1:4 (rank 1 computes 4x as long)") from None


@dataclass
class FaultConfig:
    """What failures to inject, how the job may grow or shrink, how it checkpoints and how long
    a blocking wait may last; each field's flag says what it means. The values as parsed:
    ``kills``: ``Kill``s, ``node_kills``: ``NodeKill``s, ``grow``/``grow_servers``: (count, step),
    ``leave``: (stable id, step), ``slow``: (rank id, factor). ``hostfile``: the launch's
    (hosts a discovery file may name; set from ``--hostfile``)."""

    kills: List[Kill] = option(None, "--kill", "SIGKILL rank RANK at step STEP (phase step, recovery or "
                               "checkpoint); repeatable", metavar="RANK@STEP[:PHASE]", parse=parse_kill,
                               repeatable=True)
    kill_random: float = option(0.0, "--kill-random", "each step, kill one random rank with probability P "
                                "(never rank 0, nor in --mode ps the first worker)", metavar="P",
                                bound=Bound(lambda p: 0 <= p < 1, "must be in [0, 1)"))
    kill_seed: Optional[int] = option(None, "--kill-seed", "seed of --kill-random's draws (default: --seed)",
                                      metavar="SEED", bound=at_least(0), needs=("kill_random",))
    grow: List[Tuple[int, int]] = option(None, "--grow", "spawn N more ranks before step STEP; repeatable",
                                         metavar="N@STEP", parse=parse_grow, repeatable=True, needs=(FT,))
    leave: List[Tuple[int, int]] = option(None, "--leave", "the rank with stable id ID leaves gracefully before "
                                          "step STEP (its data shards go to the others); repeatable",
                                          metavar="ID@STEP", parse=parse_leave, repeatable=True, needs=(FT,))
    grow_servers: List[Tuple[int, int]] = option(None, "--grow-servers", "ps: spawn N more shard servers before "
                                                 "step STEP (placement rebalanced); repeatable", metavar="N@STEP",
                                                 parse=parse_grow, repeatable=True, needs=(FT,))
    discover: Optional[str] = option(None, "--discover", "a file holding the wanted number of ranks, or "
                                     "HOST[:SLOTS] lines (Horovod's discovery format), polled between steps: the "
                                     "job grows or shrinks to it", metavar="FILE",
                                     needs=(FT,))
    max_ranks: Optional[int] = option(None, "--max-ranks", "the most ranks --discover may take the job to (as "
                                      "Horovod's --max-np); the hostfile's slots and Slurm's allocation bound it "
                                      "too (default: those, else 4 ranks a CPU of this node)", metavar="N",
                                      bound=Bound(lambda n: 1 <= n <= MAX_RANKS, f"must be from 1 to {MAX_RANKS}"),
                                      needs=("discover",))
    discover_every: int = option(1, "--discover-every", "poll --discover every STEPS steps", metavar="STEPS",
                                 bound=at_least(1), needs=("discover",))
    replace: bool = option(False, "--replace", "spawn a replacement for every rank lost, keeping the job's size",
                           switch=True, needs=(FT,))
    checkpoint_dir: Optional[str] = option(None, "--checkpoint-dir", "write checkpoints here and resume from the "
                                           "latest one at start", metavar="DIR")
    checkpoint_every: int = option(0, "--checkpoint-every", "checkpoint every STEPS steps (needs --checkpoint-dir)",
                                   metavar="STEPS", bound=at_least(0), needs=("checkpoint_dir",))
    checkpoint_keep: int = option(2, "--checkpoint-keep", "checkpoints kept in each folder, the newest N (at least 2: "
                                  "a PS shard written while another server dies needs the one before)", metavar="N",
                                  bound=at_least(2), needs=("checkpoint_dir",))
    deadline_s: Optional[float] = option(None, "--deadline", "abort the job when a blocking wait lasts longer (a "
                                         "hung peer; default: HPCREDUCE_DEADLINE, else 120)", metavar="SECONDS",
                                         bound=positive_finite())
    slow: List[Tuple[int, float]] = option(None, "--slow", "straggler injection: rank RANK's compute takes FACTOR "
                                           "(>= 1) times as long; repeatable", metavar="RANK:FACTOR",
                                           parse=parse_slow, repeatable=True)
    accept_server_loss: bool = option(False, "--accept-server-loss", "--mode ps --ft with one server and no "
                                      "--checkpoint-dir: run anyway, knowing that the server's death ends the job "
                                      "(a worker's death is still recovered)", switch=True,
                                      needs=(FT,))
    stop_signals: Optional[Tuple[int, ...]] = option(None, "--stop-signals", "signals that stop the run at the "
                                                     "next step boundary, checkpoint it and exit 75 (resumable): a "
                                                     "comma list of USR1, USR2, TERM, INT, or none (default: "
                                                     f"{STOP_SIGNALS.name}, else USR1,TERM)", metavar="SIGNALS",
                                                     parse=parse_signals)
    hostfile: Optional[str] = None
    node_kills: List[NodeKill] = option(None, "--kill-node", "SIGKILL every rank on node NODE (its hostname) at "
                                        "step STEP: a node lost; repeatable", metavar="NODE@STEP[:PHASE]",
                                        parse=parse_kill_node, repeatable=True)

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
        found = field_problems(self) + partner_problems(self, {FT: (ft, "in-job fault tolerance: launch with ULFM "
                                                                         "(--ft)")})
        if steps is not None and self.checkpoint_dir and self.checkpoint_every and steps > MAX_STEP:
            found.append(setting_problem("{checkpoint_dir}: a checkpoint's file name holds steps up to %d, and "
                                         "{steps} is %d" % (MAX_STEP, steps)))
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
        """When the job grows (``grow`` entries and the discovery file, bounded by ``max_ranks``,
        the hostfile's slots and Slurm's allocation: ``GrowthRule.limit``)."""
        return GrowthRule(tuple(self.grow), self.discover, self.discover_every, tuple(self.leave),
                          self.max_ranks, self.hostfile)

    def schedule(self, seed: int, protected: Sequence[int] = (0,)) -> KillSchedule:
        """The kill schedule; random kills draw from ``kill_seed``, else the run's ``seed``,
        and never pick the ids in ``protected``."""
        return KillSchedule(self.kills, self.kill_random, seed if self.kill_seed is None else self.kill_seed,
                            protected, self.node_kills)


def _spelled(kill: Kill) -> str:
    """A kill as ``--kill`` spells it."""
    return f"{kill.rank}@{kill.step}" + ("" if kill.phase == "step" else f":{kill.phase}")
