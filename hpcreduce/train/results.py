"""The result of a training run, as both trainers build it, print it and write it as JSON.

Names scripts read (keep them): ``final.loss``, ``final.accuracy`` (held-out),
``final.checksum``, ``staleness.read_max``, ``staleness.read_hist``,
``staleness.lag_hist``, ``traffic.bytes_sent`` / ``traffic.bytes_received``
(per rank, per step). Histograms are lists indexed by clocks: ``hist[k]`` counts
the events k clocks stale (``hpcreduce.ps.stats``).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ..arrays import to_host
from ..arrays.hashing import GOLDEN, mix64, name_key, unit_uniform
from ..runtime.context import Context
from .config import TrainConfig
from .model import SparseRows

PROGRESS_LINES = 10
EXACT_SHIFT = 1126  # every float64 is an integer multiple of 2**-1126 (frexp's mantissa x 2**53)
HALF = 26


def checksum_terms(name: str, value) -> np.ndarray:
    """float64 ``value[i] * r(name, i)`` for every element of a parameter, ``i`` its flat
    index in the whole tensor; ``value`` may be a whole array or ``SparseRows`` of a table.
    ``r`` is a fixed pseudo-random weight in [-1, 1) from a hash of (name, i)."""
    if isinstance(value, SparseRows):
        values = to_host(value.values).astype(np.float64)
        width = int(np.prod(values.shape[1:], dtype=np.int64))
        flat = (to_host(value.ids).astype(np.int64)[:, None] * width + np.arange(width)).reshape(-1)
    else:
        values = to_host(value).astype(np.float64)
        flat = np.arange(values.size)
    weights = unit_uniform(mix64(name_key(name) ^ (flat.astype(np.uint64) * GOLDEN))) * 2.0 - 1.0
    return values.reshape(-1) * weights


def checksum(params: Mapping[str, Any]) -> float:
    """Sum over every parameter element of ``float64(value) * r(name, flat index)``,
    exactly rounded (``math.fsum``): equal parameters give equal checksums whatever the
    order, the machine, or how a table is split into ``SparseRows`` (absent rows count
    as zeros); different parameters almost surely differ."""
    return math.fsum(np.concatenate([checksum_terms(name, value) for name, value in params.items()]
                                    or [np.zeros(0)]))


def exact_sum(terms: np.ndarray) -> int:
    """The exact sum of finite float64 ``terms`` as an integer count of ``2**-EXACT_SHIFT``:
    parts of one sum computed on several ranks add up exactly (``exact_float``). Each term is
    an int64 mantissa times a power of two; mantissas are summed per exponent in two 26-bit
    halves (no int64 overflow below 2**36 terms). Cost: a sort of the nonzero terms."""
    terms = np.asarray(terms, dtype=np.float64)
    terms = terms[terms != 0]
    if not len(terms):
        return 0
    mantissa, exponent = np.frexp(terms)
    order = np.argsort(exponent, kind="stable")
    exponent = exponent[order]
    whole = (mantissa[order] * 2.0 ** 53).astype(np.int64)
    starts = np.flatnonzero(np.diff(exponent, prepend=exponent[0] - 1))
    high = np.add.reduceat(whole >> HALF, starts).tolist()
    low = np.add.reduceat(whole & ((1 << HALF) - 1), starts).tolist()
    total = 0
    for power, upper, lower in zip(exponent[starts].tolist(), high, low):
        total += ((upper << HALF) + lower) << (power - 53 + EXACT_SHIFT)
    return total


def exact_float(total: int) -> float:
    """An ``exact_sum`` (or a sum of them) correctly rounded to float64, as ``math.fsum`` rounds."""
    return total / (1 << EXACT_SHIFT)


class StepLog:
    """One rank's per-step metrics and the bytes it moved in each step (``ctx.traffic``),
    with progress lines every ~10% of ``total_steps``."""

    def __init__(self, ctx: Context, total_steps: int):
        self.ctx, self.total_steps = ctx, total_steps
        self.rows: List[Dict[str, Any]] = []
        self.bytes_sent: List[int] = []
        self.bytes_received: List[int] = []
        self.started = time.perf_counter()
        self._traffic_mark = (ctx.traffic.sent, ctx.traffic.received)
        self._progress_mark = 0

    def record(self, step: int, loss: float, accuracy: float, examples: int, **extra: Any) -> None:
        """Log step ``step`` (from 1); the bytes moved since the previous record count as its own."""
        sent, received = self.ctx.traffic.sent, self.ctx.traffic.received
        self.bytes_sent.append(sent - self._traffic_mark[0])
        self.bytes_received.append(received - self._traffic_mark[1])
        self._traffic_mark = (sent, received)
        self.rows.append({"step": step, "loss": loss, "accuracy": accuracy, "examples": examples,
                          "wall_s": round(time.perf_counter() - self.started, 6), **extra})

    def progress_line(self) -> Optional[str]:
        """A line for the steps since the previous one, when the last step ends a tenth of
        the run (or the run); None otherwise."""
        step = self.rows[-1]["step"]
        every = max(1, self.total_steps // PROGRESS_LINES)
        if step % every and step != self.total_steps:
            return None
        recent = self.rows[self._progress_mark:]
        self._progress_mark = len(self.rows)
        examples = sum(row["examples"] for row in recent) or 1
        loss = sum(row["loss"] * row["examples"] for row in recent) / examples
        accuracy = sum(row["accuracy"] * row["examples"] for row in recent) / examples
        elapsed = time.perf_counter() - self.started
        width = len(str(self.total_steps))
        return (f"step {step:>{width}}/{self.total_steps}  loss {loss:.4f}  accuracy {accuracy:.4f}"
                f"  (train, last {len(recent)} steps)  {elapsed:.1f} s")

    def drop_after(self, step: int) -> None:
        """Forget the steps after ``step`` (they are computed again)."""
        keep = sum(1 for row in self.rows if row["step"] <= step)
        del self.rows[keep:], self.bytes_sent[keep:], self.bytes_received[keep:]
        self._progress_mark = min(self._progress_mark, keep)

    def gather_traffic(self) -> Dict[str, List[List[int]]]:
        """Every rank's bytes per step, ``[rank][step]`` (collective; once, at the end)."""
        sent, received = zip(*self.ctx.comm.allgather((self.bytes_sent, self.bytes_received)))
        return {"bytes_sent": list(sent), "bytes_received": list(received)}


@dataclass
class FinalMetrics:
    """The trained parameters on the held-out split, and their checksum (see ``checksum``)."""

    loss: float
    accuracy: float
    checksum: float


@dataclass
class TrainResult:
    """What ``train`` returns on every rank.

    ``steps``: one row per step (step, loss, accuracy, examples, wall_s, ...);
    ``traffic``: ``bytes_sent``/``bytes_received`` per rank, per step; ``staleness``:
    ``read_max``, ``read_hist``, ``lag_hist``; ``recovery``: the recovery events (runs
    that can recover); ``ps``: what the parameter servers report (PS mode);
    ``sandblaster``: the Sandblaster counters (units counted, backups issued, duplicates
    discarded, iterations, evaluations, pass_s, units_by_worker, ...; sandblaster mode);
    ``nodes``: the node (hostname) of each rank at the end, by rank;
    ``params``: the trained parameters, whole (PS mode, a model above ``ps.final.WHOLE_BYTES``:
    this rank's part: the dense tables and, on a server, its own rows as ``SparseRows``), and
    ``gradient`` (sandblaster mode): the flat objective gradient at them (both kept in memory,
    never written); ``memory``: ``peak_rss_bytes`` and ``roles`` by rank (PS mode);
    ``start``: the initial model's held-out ``loss`` and ``accuracy``, and ``diverged``: None, or
    the signs of divergence with ``worse_than_start``, ``likely_cause`` and ``advice``
    (``train.divergence``; both set at the end of every run).
    ``to_json()`` is what ``--json`` writes, under the names scripts read.
    """

    config: TrainConfig
    model: str
    ranks: int
    worker_count: int
    dataset: Dict[str, Any]
    steps: List[Dict[str, Any]]
    traffic: Dict[str, List[List[int]]]
    staleness: Dict[str, Any]
    wall_s: float
    train_s: float
    final: FinalMetrics
    params: Dict[str, Any] = field(default_factory=dict, repr=False)
    recovery: Optional[List[Dict[str, Any]]] = None
    ps: Optional[Dict[str, Any]] = None
    sandblaster: Optional[Dict[str, Any]] = None
    gradient: Optional[np.ndarray] = field(default=None, repr=False)
    nodes: List[str] = field(default_factory=list)
    memory: Optional[Dict[str, Any]] = None
    start: Optional[Dict[str, float]] = None
    diverged: Optional[Dict[str, Any]] = None

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def servers(self) -> int:
        return self.ranks - self.worker_count

    @property
    def samples_per_s(self) -> float:
        return len(self.steps) * self.config.batch / max(self.train_s, 1e-9)

    def to_json(self) -> Dict[str, Any]:
        """The result as plain JSON values (``params`` left out)."""
        found = {"config": self.config.as_dict(), "mode": self.mode, "model": self.model, "ranks": self.ranks,
                 "workers": self.worker_count, "servers": self.servers, "dataset": self.dataset, "steps": self.steps,
                 "traffic": self.traffic, "staleness": self.staleness, "wall_s": self.wall_s,
                 "train_s": self.train_s, "samples_per_s": self.samples_per_s, "final": asdict(self.final),
                 "start": self.start, "diverged": self.diverged}
        if self.nodes:
            found["nodes"] = self.nodes
        if self.ps is not None:
            found["ps"] = self.ps
        if self.recovery is not None:
            found["recovery"] = self.recovery
        if self.sandblaster is not None:
            found["sandblaster"] = self.sandblaster
        if self.memory is not None:
            found["memory"] = self.memory
        return found


def final_line(result: TrainResult) -> str:
    """One line summing up a result."""
    final, data = result.final, result.dataset
    bayes = data.get("bayes_accuracy")
    reference = f", Bayes accuracy {bayes:.4f}" if bayes is not None else ""
    line = (f"final: loss {final.loss:.4f}  accuracy {final.accuracy:.4f}  "
            f"(held out: {data['test_examples']} examples{reference})  "
            f"checksum {final.checksum:.12e}  {result.wall_s:.2f} s, "
            f"{result.samples_per_s:.0f} samples/s on {result.worker_count} workers")
    line += f"\n{memory_line(result.memory)}" if result.memory else ""
    return line + (f"\n{diverged_line(result.diverged)}" if result.diverged else "")


def diverged_line(diverged: Mapping[str, Any]) -> str:
    """``warning: the run diverged: SIGNS; likely cause: ...; try ...`` (``train.divergence``)."""
    ended = "the model ended worse than it started" if diverged["worse_than_start"] else "the run diverged"
    return (f"warning: {ended}: {'; '.join(diverged['signs'])}. Likely cause: {diverged['likely_cause']}; "
            f"try {diverged['advice']}")


def memory_line(memory: Mapping[str, Any]) -> str:
    """The largest peak RSS of each role: ``memory: peak RSS server 1.2 GiB (rank 0), ...``."""
    largest: Dict[str, Any] = {}
    for rank, (peak, role) in enumerate(zip(memory["peak_rss_bytes"], memory["roles"])):
        if role not in largest or peak > largest[role][0]:
            largest[role] = (peak, rank)
    return "memory: peak RSS " + ", ".join(f"{role} {peak / 2**30:.2f} GiB (rank {rank})"
                                           for role, (peak, rank) in sorted(largest.items()))
