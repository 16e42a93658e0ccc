"""Settings of one training run, shared by the ring and parameter-server trainers."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

from ..ft.options import FaultConfig
from .optimizers import OPTIMIZERS

MODES = ("ring", "ps")
CONSISTENCIES = ("bsp", "ssp", "asp")
PROGRESS = ("auto", "bar", "lines", "none")


@dataclass
class TrainConfig:
    """What ``hpcreduce train`` was asked to do.

    ``batch`` is the global batch per step, split over the workers (all ranks in ring
    mode, the non-server ranks in PS mode), so the run computes the same thing for any
    number of workers.
    """

    mode: str = "ring"
    model: str = "logreg"
    steps: int = 200
    batch: int = 4096
    lr: float = 0.2
    optimizer: str = "adagrad"
    seed: int = 0
    servers: int = 1
    consistency: str = "bsp"
    staleness: int = 0
    fetch_every: int = 1
    push_every: int = 1
    json_path: Optional[str] = None
    progress: str = "auto"
    metrics_path: Optional[str] = None
    timeline_path: Optional[str] = None
    fault: FaultConfig = field(default_factory=FaultConfig)

    def problems(self, size: int) -> list:
        """What is wrong with these settings for a job of ``size`` ranks (empty when fine)."""
        found = []
        if self.mode not in MODES:
            found.append(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.consistency not in CONSISTENCIES:
            found.append(f"--consistency must be one of {', '.join(CONSISTENCIES)}, got {self.consistency!r}")
        if self.steps < 1 or self.batch < 1:
            found.append(f"--steps and --batch must be at least 1, got {self.steps} and {self.batch}")
        if not self.lr > 0:
            found.append(f"--lr must be positive, got {self.lr}")
        if self.optimizer not in OPTIMIZERS:
            found.append(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.seed < 0:
            found.append(f"--seed must be >= 0, got {self.seed}")
        if self.progress not in PROGRESS:
            found.append(f"--progress must be one of {', '.join(PROGRESS)}, got {self.progress!r}")
        if self.mode == "ring" and (self.consistency != "bsp" or self.staleness or self.servers != 1
                                    or self.fetch_every != 1 or self.push_every != 1):
            found.append("--servers, --consistency, --staleness, --fetch-every and --push-every "
                         "belong to --mode ps; ring mode is synchronous")
        if self.mode == "ps":
            if not 1 <= self.servers < size:
                found.append(f"--servers K needs 1 <= K < ranks ({size}), got {self.servers}")
            if self.consistency != "ssp" and self.staleness:
                found.append("--staleness only applies to --consistency ssp")
            if self.consistency == "ssp" and self.staleness < 0:
                found.append(f"--staleness must be >= 0, got {self.staleness}")
            if self.consistency != "asp" and (self.fetch_every != 1 or self.push_every != 1):
                found.append("--fetch-every and --push-every only apply to --consistency asp")
            if self.fetch_every < 1 or self.push_every < 1:
                found.append("--fetch-every and --push-every must be at least 1")
        return found

    def output_paths(self) -> Dict[str, str]:
        """The files rank 0 or the reporting rank will write, by flag: --json, --metrics, --timeline."""
        paths = (("--json", self.json_path), ("--metrics", self.metrics_path),
                 ("--timeline", self.timeline_path))
        return {flag: path for flag, path in paths if path}

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)
