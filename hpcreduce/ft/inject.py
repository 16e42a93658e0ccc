"""Fault injection: real SIGKILLs on a schedule of (rank, step), or at random.

Ranks are named by their stable id: the rank in the launch's MPI_COMM_WORLD for
ranks started by mpirun/srun, the next free number for ranks that joined later. A kill
fires at a phase of its step: ``step`` (its start, before any communication),
``recovery`` (inside a recovery that happens at that step, between revoke and
shrink) or ``checkpoint`` (half way through writing that step's checkpoint); phase
``hang`` makes the rank stop at the start of the step instead of dying: a hung peer that MPI
never reports, for the deadline watchdog. It sleeps until its launcher is gone, then exits:
Open MPI 5.0.11's mpirun, aborted with ULFM enabled, left hung ranks (stopped or sleeping)
running after the job, so the injected one cleans up after itself. Before
dying, the victim appends the time to ``HPCREDUCE_KILL_LOG`` (if set) so that
benchmarks can measure from the kill itself. Kills fire in a launch's first attempt
only (``HPCREDUCE_ATTEMPT`` unset or 0): a relaunched job resumes, it is not killed again.
A node is lost with ``NodeKill``: at that phase of that step every rank whose node (short
hostname, ``runtime.nodes.this_node``) has that name dies, each one on its own, as when
the machine goes down.
"""
from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from ..errors import HpcreduceError
from ..runtime.files import refuse_foreign_link
from ..runtime.hosts import hostfile_hosts
from ..runtime.nodes import this_node
from ..runtime.settings import Setting, non_negative_integer, text_value

ATTEMPT = Setting("HPCREDUCE_ATTEMPT", non_negative_integer, 0, "a launch attempt number (0 or more)")
KILL_LOG = Setting("HPCREDUCE_KILL_LOG", text_value, "", "a file path")
PHASES = ("step", "recovery", "checkpoint", "hang")


@dataclass(frozen=True)
class Kill:
    rank: int
    step: int
    phase: str = "step"


@dataclass(frozen=True)
class NodeKill:
    """Every rank of node ``node`` dies at ``phase`` of ``step``."""

    node: str
    step: int
    phase: str = "step"


def parse_kill_node(text: str) -> NodeKill:
    """``NODE@STEP`` or ``NODE@STEP:PHASE`` (NODE: a short hostname)."""
    node, _, rest = text.rpartition("@")
    step, _, phase = rest.partition(":")
    try:
        kill = NodeKill(node, int(step), phase or "step")
    except ValueError:
        kill = None
    if kill is None or not node or kill.step < 0 or kill.phase not in PHASES:
        raise ValueError(f"{text!r}: expected NODE@STEP or NODE@STEP:PHASE (NODE a host name, STEP >= 0, "
                         f"PHASE one of {', '.join(PHASES)})")
    return kill


def unknown_node_problem(node_kills: Sequence[NodeKill], nodes: Sequence[str]) -> Optional[str]:
    """Why a node kill can never fire (no rank runs on its node), or None; ``nodes``: the job's."""
    unknown = sorted({kill.node for kill in node_kills} - set(nodes))
    if not unknown:
        return None
    return f"no rank runs on node(s) {', '.join(unknown)}: the job's nodes are {', '.join(sorted(set(nodes)))}"


def hostfile_node_problem(node_kills: Sequence[NodeKill], hostfile: Optional[str]) -> Optional[str]:
    """``unknown_node_problem`` against the hosts of ``hostfile`` (None without one, or when it
    cannot be read: the launch checks report that)."""
    if not (node_kills and hostfile):
        return None
    try:
        hosts = hostfile_hosts(hostfile)
    except HpcreduceError:
        return None
    return unknown_node_problem(node_kills, [host.split(".")[0] for host in hosts])


def parse_kill(text: str) -> Kill:
    """``RANK@STEP`` or ``RANK@STEP:PHASE``."""
    try:
        rank, rest = text.split("@", 1)
        step, _, phase = rest.partition(":")
        kill = Kill(int(rank), int(step), phase or "step")
    except ValueError:
        raise ValueError(f"{text!r}: expected RANK@STEP or RANK@STEP:PHASE "
                         f"(PHASE one of {', '.join(PHASES)})") from None
    if kill.phase not in PHASES or kill.rank < 0 or kill.step < 0:
        raise ValueError(f"{text!r}: rank and step must be >= 0 and PHASE one of {', '.join(PHASES)}")
    return kill


class KillSchedule:
    """Decides, identically on every rank, whether this rank dies now."""

    def __init__(self, kills: Iterable[Kill] = (), random_probability: float = 0.0, seed: int = 0,
                 protected: Sequence[int] = (0,), node_kills: Iterable[NodeKill] = ()):
        self.kills: List[Kill] = list(kills)
        self.node_kills: List[NodeKill] = list(node_kills)
        self.node = this_node() if self.node_kills else ""
        self.random_probability = random_probability
        self.seed = seed
        self.protected = set(protected)
        self.enabled = ATTEMPT.value() == 0

    def victims(self, phase: str, step: int, alive: Sequence[int]) -> List[int]:
        """Stable ids to kill at this phase of this step, among ``alive`` ones.

        Random kills draw at most one victim per step from a generator seeded by the
        step, so every rank draws the same; ``protected`` ids (rank 0 by default, which
        reports) and the last two ranks standing are never drawn.
        """
        if not self.enabled:
            return []
        chosen = [k.rank for k in self.kills if k.step == step and k.phase == phase and k.rank in alive]
        if phase == "step" and self.random_probability > 0:
            draw = random.Random(self.seed * 1_000_003 + step)
            candidates = [r for r in alive if r not in self.protected and r not in chosen]
            if draw.random() < self.random_probability and len(alive) - len(chosen) > 2 and candidates:
                chosen.append(draw.choice(candidates))
        return chosen

    def node_struck(self, phase: str, step: int) -> bool:
        """Whether this rank's node goes down at this phase of this step."""
        return self.enabled and any(k.node == self.node and k.step == step and k.phase == phase
                                    for k in self.node_kills)

    def strike(self, phase: str, step: int, me: int, alive: Sequence[int]) -> None:
        """SIGKILL this process (or hang it) if it is a victim now, alone or with its node."""
        if me in self.victims(phase, step, alive) or self.node_struck(phase, step):
            die(f"{phase} of step {step}")
        if phase == "step" and (me in self.victims("hang", step, alive) or self.node_struck("hang", step)):
            record(f"hang at step {step}")
            launcher = os.getppid()
            while os.getppid() == launcher:
                time.sleep(0.2)
            os._exit(1)


def record(reason: str) -> None:
    """Append the moment and ``reason`` to ``HPCREDUCE_KILL_LOG``, if set."""
    log = KILL_LOG.value()
    if log:
        refuse_foreign_link(log)
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{time.time():.6f} {os.getpid()} {reason}\n")
            handle.flush()
            os.fsync(handle.fileno())


def kill_times(path: str) -> List[float]:
    """The moments (``time.time()``) the kill log at ``path`` holds, in order; none if it is absent."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return sorted(float(line.split()[0]) for line in handle if line.strip())


def die(reason: str) -> None:
    """Record the moment, then SIGKILL this very process."""
    record(reason)
    os.kill(os.getpid(), signal.SIGKILL)
