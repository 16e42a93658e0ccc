"""Fault-tolerance settings of a run: injected failures, growth, checkpoints, deadlines."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ..errors import SettingProblem, setting_problem
from .growth import GrowthRule
from .inject import Kill, KillSchedule


@dataclass
class FaultConfig:
    """``kills``: (rank, step[, phase]) to SIGKILL; ``kill_random``: probability of one random
    kill per step; ``grow``: (count, step) growth; ``discover``: file holding the wanted
    number of ranks, polled between steps; ``replace``: spawn a replacement per lost rank;
    ``checkpoint_dir``/``checkpoint_every``: periodic checkpoints (the fallback without
    ULFM, resumed when the job is relaunched); ``deadline_s``: longest blocking wait (None: ``HPCREDUCE_DEADLINE``, else 120 s)."""

    kills: List[Kill] = field(default_factory=list)
    kill_random: float = 0.0
    kill_seed: Optional[int] = None
    grow: List[Tuple[int, int]] = field(default_factory=list)
    discover: Optional[str] = None
    discover_every: int = 1
    replace: bool = False
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    deadline_s: Optional[float] = None

    def needs_ulfm(self) -> bool:
        """Whether the run can only go on in-job (ULFM): kills without checkpoints, growth."""
        return bool(self.grow or self.discover or self.replace
                    or ((self.kills or self.kill_random) and not self.checkpoint_dir))

    def problems(self) -> List[SettingProblem]:
        """What is wrong with these settings, by field name (empty when fine)."""
        found = []
        if not 0 <= self.kill_random < 1:
            found.append(setting_problem("{kill_random} must be in [0, 1), got {value}", value=self.kill_random))
        if self.checkpoint_every < 0 or self.discover_every < 1:
            found.append(setting_problem("{checkpoint_every} must be >= 0 and {discover_every} >= 1"))
        if self.checkpoint_every and not self.checkpoint_dir:
            found.append(setting_problem("{checkpoint_every} needs {checkpoint_dir}"))
        if self.deadline_s is not None and not 0 < self.deadline_s < float("inf"):
            found.append(setting_problem("{deadline_s} must be positive, got {value}", value=self.deadline_s))
        return found

    @property
    def growth(self) -> GrowthRule:
        """When the job grows (``grow`` entries and the discovery file)."""
        return GrowthRule(tuple(self.grow), self.discover, self.discover_every)

    def schedule(self, seed: int, protected: Sequence[int] = (0,)) -> KillSchedule:
        """The kill schedule; random kills draw from ``kill_seed``, else the run's ``seed``,
        and never pick the ids in ``protected``."""
        return KillSchedule(self.kills, self.kill_random, seed if self.kill_seed is None else self.kill_seed,
                            protected)
