"""The runs of ``hpcreduce bench soak``, drawn from a seed: topology, consistency, ranks, servers, victims.

Runs alternate between the parameter server and the ring; within each, the consistency (PS)
and the kind of victim cycle through every choice in an order shuffled anew each cycle, so a
long soak covers them all while the ranks, servers, victims and steps are drawn at random.
A kill during the recovery from another is ``B@S:recovery`` next to ``A@S`` in the ring, whose
ranks step together; in PS mode it is ``B@1:recovery`` (the first recovery): a PS recovery's step
is the most advanced survivor's clock + 1, which may lag the victim's step (SSP and ASP by
several steps, BSP by one), so ``B@S:recovery`` would at times never fire.
Harder victims (``HARD``), where a clear error is as good an ending as a recovery: a rank
SIGSTOPped (hung, not dead; ``--deadline`` ``STOP_DEADLINE`` s), the Open MPI daemon of the second
of two nodes SIGKILLed (drawn only where ``two_nodes`` can set them up), a rank SIGKILLed while
the job spawns for ``--grow 1@S`` or for ``--replace`` of a rank killed at S, and a rank killed
at the step another leaves at (PS: a server leaves, a worker dies). The driver delivers the first
three from outside (``soak_faults``).
Every draw leaves the run something to recover with: a worker (a PS server's death
promotes a worker when no server is left), and a copy of every shard unless the run
writes checkpoints (two PS servers that die together are neighbours on the key ring
when K <= 3, so such runs, victims ``servers`` or a ``two`` that drew two servers, get
``--checkpoint-dir`` and die after its first checkpoint).
"""
from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, replace
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from ..ft.faults import FaultConfig
from .soak_faults import External

TOPOLOGIES = ("ps", "ring")
CONSISTENCIES = ("bsp", "ssp", "asp")
HARD = ("stop", "daemon", "grow", "replace", "leave")
VICTIMS = {
    "ring": ("one", "two", "recovery", "random", *HARD),
    "ps": ("worker", "server", "servers", "two", "recovery", "random", *HARD),
}
FEWEST_RANKS = 4
FEWEST_STEPS = 12
RANDOM_PROBABILITY = 0.1
CHECKPOINT_EVERY = 5
STALENESS = 2
STOP_DEADLINE = 15


@dataclass(frozen=True)
class SoakRun:
    """One run: its configuration, its victims (``--kill`` texts, or ``--kill-random``)."""

    index: int
    topology: str
    consistency: str
    ranks: int
    servers: int
    victims: str
    kills: Tuple[str, ...] = ()
    kill_seed: Optional[int] = None
    checkpoint: bool = False
    extra: Tuple[str, ...] = ()  # more train flags: --grow, --replace, --leave, --deadline
    external: Optional[External] = None  # what the driver does to the run from outside

    @property
    def hard(self) -> bool:
        """Whether a clear error is as good an ending as a recovery (``HARD`` victims)."""
        return self.victims in HARD

    @property
    def nodes(self) -> bool:
        """Whether the run is launched on two nodes (its daemon is the victim)."""
        return self.victims == "daemon"

    @property
    def configuration(self) -> Tuple[Any, ...]:
        """What its run without failures shares with it (the quiet run is cached by it). Ring and
        BSP train the same global batches on any number of ranks and servers, up to summation order."""
        if self.consistency == "bsp":
            return (self.topology, self.consistency)
        return (self.topology, self.consistency, self.ranks, self.servers)

    def describe(self) -> str:
        where = f"ps {self.consistency} N={self.ranks} K={self.servers}" if self.topology == "ps" \
            else f"ring N={self.ranks}"
        if self.hard:
            said = [" ".join(self.extra[:2]) if self.extra[:1] in (("--grow",), ("--leave",)) else "",
                    " ".join(self.kills), self.external.describe() if self.external else ""]
            return f"{where} [{self.victims}: {', '.join(part for part in said if part)}]"
        killed = " ".join(self.kills) if self.kills else f"random p={RANDOM_PROBABILITY} seed={self.kill_seed}"
        return f"{where} [{self.victims}: {killed}{' +ckpt' if self.checkpoint else ''}]"

    def expected_lost(self) -> Optional[FrozenSet[int]]:
        """The ids that must die (None: drawn at random, at least one); for a hard victim, those
        that must be among the lost when the run recovers."""
        if self.victims == "random":
            return None
        killed = {int(kill.split("@")[0]) for kill in self.kills}
        if self.external and self.external.kind in ("stop", "spawn"):
            killed.add(self.external.target)
        if self.external and self.external.kind == "daemon":  # node2: the smaller half, the last ranks
            killed |= set(range(self.ranks - self.ranks // 2, self.ranks))
        return frozenset(killed)

    def train_args(self, steps: int, batch: int, quiet: bool = False,
                   checkpoint_dir: Optional[str] = None) -> List[str]:
        """``hpcreduce train`` arguments of this run (``quiet``: its run without failures)."""
        args = ["-n", str(self.ranks), "--mode", self.topology, "--steps", str(steps), "--batch", str(batch),
                "--table-rows", "65536", "--seed", "1"]
        if self.topology == "ps":
            args += ["--servers", str(self.servers), "--consistency", self.consistency]
            args += ["--staleness", str(STALENESS)] if self.consistency == "ssp" else []
        if quiet:
            return args
        args.append("--ft")
        args += [part for kill in self.kills for part in ("--kill", kill)] + list(self.extra)
        if self.kill_seed is not None:
            args += ["--kill-random", str(RANDOM_PROBABILITY), "--kill-seed", str(self.kill_seed)]
        if self.checkpoint and checkpoint_dir:
            args += ["--checkpoint-dir", checkpoint_dir, "--checkpoint-every", str(CHECKPOINT_EVERY)]
        return args


def command_line(args: Sequence[str], kill_log: str, env: Optional[Dict[str, str]] = None,
                 external: Optional[External] = None) -> str:
    """The shell line that reproduces a run by hand (``env`` added; the driver's ``external``
    fault, to deliver by hand, said in a comment)."""
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in {"HPCREDUCE_KILL_LOG": kill_log,
                                                                              **(env or {})}.items())
    line = f"{assignments} hpcreduce train {' '.join(map(shlex.quote, args))}"
    return line + (f"  # then by hand: {external.describe()}" if external else "")


class _Cycle:
    """Hands out every choice once per cycle, in an order shuffled anew each cycle."""

    def __init__(self, rng: random.Random, choices: Sequence[str]):
        self.rng, self.choices = rng, list(choices)
        self.left: List[str] = []

    def next(self) -> str:
        if not self.left:
            self.left = self.rng.sample(self.choices, len(self.choices))
        return self.left.pop()


def draw_runs(count: int, seed: int, most_ranks: int, steps: int, nodes: bool = True) -> List[SoakRun]:
    """``count`` runs drawn from ``seed``, on 4 to ``most_ranks`` ranks, killing in steps 4..steps-5
    (``steps`` >= FEWEST_STEPS; two servers lost together: after the first checkpoint); ``nodes``:
    whether two nodes can be set up here (else no daemon victim is drawn)."""
    rng = random.Random(seed)
    consistencies = _Cycle(rng, CONSISTENCIES)
    victims: Dict[str, _Cycle] = {topology: _Cycle(rng, [kind for kind in kinds if nodes or kind != "daemon"])
                                  for topology, kinds in VICTIMS.items()}
    runs = []
    for index in range(count):
        topology = TOPOLOGIES[index % len(TOPOLOGIES)]
        ranks = rng.randint(FEWEST_RANKS, most_ranks)
        if topology == "ps":
            servers = rng.choice([k for k in (2, 3) if ranks - k >= 2])
            consistency = consistencies.next()
        else:
            servers, consistency = 0, "bsp"
        kind = victims[topology].next()
        runs.append(_with_victims(rng, SoakRun(index, topology, consistency, ranks, servers, kind), steps))
    return runs


def _with_victims(rng: random.Random, run: SoakRun, steps: int) -> SoakRun:
    if run.victims == "random":
        return replace(run, kill_seed=_killing_seed(rng, run, steps))
    if run.hard:
        return _with_hard_victims(rng, run, steps)
    count = 1 if run.victims in ("one", "worker", "server") else 2
    ids = _victim_ids(rng, run, count)
    servers_lost = sum(1 for i in ids if i < run.servers)
    step = rng.randint(CHECKPOINT_EVERY + 2 if servers_lost >= 2 else 4, steps - 5)  # after a checkpoint
    kills = [f"{i}@{step}" for i in ids]
    if run.victims == "recovery":  # PS: in the first recovery, whatever its step (see the module's doc)
        kills[1] = f"{ids[1]}@{step if run.topology == 'ring' else 1}:recovery"
    return replace(run, kills=tuple(kills), checkpoint=servers_lost >= 2)


def _with_hard_victims(rng: random.Random, run: SoakRun, steps: int) -> SoakRun:
    """A hard victim (``HARD``) at a step in 4..steps/2 (the driver's fault must find the run
    still going); each leaves a worker and a copy of every PS shard (a server stopped or killed
    while spawning has a replica on another)."""
    step = rng.randint(4, steps // 2)
    one, other = _victim_ids(rng, replace(run, victims="two"), 2)
    if run.victims == "stop":
        return replace(run, external=External("stop", one, step), extra=("--deadline", str(STOP_DEADLINE)))
    if run.victims == "daemon":
        return replace(run, external=External("daemon", 2, step))
    if run.victims == "grow":
        return replace(run, external=External("spawn", one, step - 1), extra=("--grow", f"1@{step}"))
    if run.victims == "replace":
        return replace(run, kills=(f"{one}@{step}",), external=External("spawn", other, step - 1), extra=("--replace",))
    if run.topology == "ps":  # a server leaves (K >= 2: one stays), a worker dies
        one, other = rng.randrange(run.servers), rng.randrange(run.servers, run.ranks)
    return replace(run, kills=(f"{other}@{step}",), extra=("--leave", f"{one}@{step}"))


def _victim_ids(rng: random.Random, run: SoakRun, count: int) -> List[int]:
    """``count`` distinct ids to kill that leave a worker (after any promotion) standing."""
    if run.victims == "worker":
        return [rng.randrange(run.servers, run.ranks)]
    if run.victims == "server":
        return [rng.randrange(run.servers)]
    if run.victims == "servers":  # a shard and its replica together: the run writes checkpoints
        return rng.sample(range(run.servers), 2)
    while True:
        ids = rng.sample(range(run.ranks), count)
        workers_left = run.ranks - run.servers - sum(1 for i in ids if i >= run.servers)
        promoted = 1 if run.topology == "ps" and all(s in ids for s in range(run.servers)) else 0
        if run.topology == "ring" or workers_left - promoted >= 1:
            return ids


def _killing_seed(rng: random.Random, run: SoakRun, steps: int) -> int:
    """A ``--kill-seed`` whose first random kill falls in steps 4..steps-5 (so the run surely loses a rank)."""
    protected = (0, run.servers) if run.topology == "ps" else (0,)
    alive = list(range(run.ranks))
    while True:
        seed = rng.randrange(1 << 30)
        schedule = FaultConfig(kill_random=RANDOM_PROBABILITY, kill_seed=seed).schedule(0, protected=protected)
        first = next((s for s in range(1, steps + 1) if schedule.victims("step", s, alive)), None)
        if first is not None and 4 <= first <= steps - 5:
            return seed
