"""What recoveries happened, for the JSON results and rank 0's console."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class RecoveryEvent:
    """One change of the job's ranks.

    ``kind``: failure, growth, leave or resume. ``step``: the step being attempted (from 1).
    ``lost``/``joined``/``left``: stable rank ids (``left``: ranks that left gracefully,
    ``--leave`` or the discovery file; ``requested_at``: when that was decided, wall clock).
    ``detected_at``/``next_step_at``: wall-clock seconds (``time.time()``, comparable with the
    kill log); ``shrink_s``, ``restore_s`` and ``to_next_step_s`` are measured from the detection.
    ``requeued``: on a resume, how many times Slurm had requeued the job (``SLURM_RESTART_COUNT``).
    """

    kind: str
    step: int
    ranks_before: int
    detected_at: float
    lost: List[int] = field(default_factory=list)
    joined: List[int] = field(default_factory=list)
    left: List[int] = field(default_factory=list)
    requested_at: Optional[float] = None
    ranks_after: int = 0
    rounds: int = 0
    shrink_s: float = 0.0
    restore_s: float = 0.0
    next_step_at: Optional[float] = None
    to_next_step_s: Optional[float] = None
    requeued: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind == "resume" and self.requeued is None:  # a Slurm job's requeues so far (issue 37)
            self.requeued = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)

    def line(self) -> str:
        parts = [f"lost rank(s) {self.lost}" if self.lost else "",
                 f"joined rank(s) {self.joined}" if self.joined else "",
                 f"left rank(s) {self.left}" if self.left else "",
                 f"{self.ranks_before} -> {self.ranks_after} ranks",
                 f"shrink {self.shrink_s * 1e3:.1f} ms" if self.kind == "failure" else "",
                 f"restore {self.restore_s * 1e3:.1f} ms",
                 f"next step after {self.to_next_step_s * 1e3:.1f} ms" if self.to_next_step_s is not None else ""]
        return f"recovery: {self.kind} at step {self.step}: " + ", ".join(part for part in parts if part)


class EventLog:
    """Events of this run, oldest first; the next completed step closes the open ones."""

    def __init__(self) -> None:
        self.events: List[RecoveryEvent] = []

    def add(self, event: RecoveryEvent) -> RecoveryEvent:
        self.events.append(event)
        return event

    def step_completed(self) -> List[RecoveryEvent]:
        """Stamp the open events with this moment; return the ones just closed."""
        now = time.time()
        closed = [e for e in self.events if e.next_step_at is None]
        for event in closed:
            event.next_step_at = now
            event.to_next_step_s = now - event.detected_at
        return closed

    def as_dicts(self) -> List[Dict[str, Any]]:
        return [asdict(event) for event in self.events]
