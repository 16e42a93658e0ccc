"""The result of a training run, as both trainers build it, print it and write it as JSON.

Names scripts read (keep them): ``final.loss``, ``final.accuracy`` (held-out),
``final.checksum``, ``staleness.read_max``, ``staleness.read_hist``,
``staleness.lag_hist``, ``traffic.bytes_sent`` / ``traffic.bytes_received``
(per rank, per step). Histograms are lists indexed by clocks: ``hist[k]`` counts
the events k clocks stale.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional

import numpy as np

from ..runtime.context import Context
from .config import TrainConfig
from .data import Dataset
from .hashing import GOLDEN, mix64, name_key, unit_uniform
from .model import Model, SparseRows

PROGRESS_LINES = 10
IN_MEMORY_ONLY = ("params",)


def to_host(x) -> np.ndarray:
    """A numpy copy or view of a numpy or cupy array."""
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)


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


def histogram(clocks: Iterable[int]) -> List[int]:
    """Counts of each staleness value: ``result[k]`` = how many were ``k`` clocks stale."""
    values = np.asarray(list(clocks), dtype=np.int64)
    return np.bincount(values).tolist() if values.size else []


def staleness_summary(read_clocks: Iterable[int], lag_clocks: Iterable[int]) -> Dict[str, Any]:
    """``read_max`` and ``read_hist`` of how stale the parameters each read saw were, and
    ``lag_hist`` of how many clocks late each gradient was applied (PS semantics;
    ring mode is all zeros: one read and one gradient per worker per step)."""
    reads = histogram(read_clocks)
    return {"read_max": len(reads) - 1 if reads else 0, "read_hist": reads,
            "lag_hist": histogram(lag_clocks)}


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

    def gather_traffic(self) -> Dict[str, List[List[int]]]:
        """Every rank's bytes per step, ``[rank][step]`` (collective; once, at the end)."""
        sent, received = zip(*self.ctx.comm.allgather((self.bytes_sent, self.bytes_received)))
        return {"bytes_sent": list(sent), "bytes_received": list(received)}


def build_result(*, config: TrainConfig, ctx: Context, workers: int, model: Model,
                 dataset: Dataset, log: StepLog, traffic: Mapping[str, Any],
                 staleness: Mapping[str, Any], loss: float, accuracy: float,
                 params_checksum: float, train_s: float, wall_s: float,
                 **extra: Any) -> Dict[str, Any]:
    """The run's result: config, job shape, data set, per-step metrics, traffic,
    staleness, timing and ``final`` (held-out loss and accuracy, parameter checksum).
    ``extra`` keys are added as they are (``params`` stays out of the JSON file)."""
    return {
        "config": config.as_dict(),
        "mode": config.mode,
        "model": model.name,
        "ranks": ctx.size,
        "workers": workers,
        "servers": ctx.size - workers,
        "dataset": dataset.info(),
        "steps": log.rows,
        "traffic": dict(traffic),
        "staleness": dict(staleness),
        "wall_s": wall_s,
        "train_s": train_s,
        "samples_per_s": len(log.rows) * config.batch / max(train_s, 1e-9),
        "final": {"loss": loss, "accuracy": accuracy, "checksum": params_checksum},
        **extra,
    }


def final_line(result: Mapping[str, Any]) -> str:
    """One line summing up a result."""
    final, data = result["final"], result["dataset"]
    bayes = data.get("bayes_accuracy")
    reference = f", Bayes accuracy {bayes:.4f}" if bayes is not None else ""
    return (f"final: loss {final['loss']:.4f}  accuracy {final['accuracy']:.4f}  "
            f"(held out: {data['test_examples']} examples{reference})  "
            f"checksum {final['checksum']:.12e}  {result['wall_s']:.2f} s, "
            f"{result['samples_per_s']:.0f} samples/s on {result['workers']} workers")


def json_path_problem(path: str, flag: str = "--json") -> Optional[str]:
    """Why ``write_json`` (or any writer of the file ``flag`` names) could not write
    ``path`` (its folder is created if missing), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        return f"{flag} {path}: cannot create its folder: {err.strerror}"
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        return f"{flag} {path}: not a writable file path"
    return None


def write_json(path: str, result: Mapping[str, Any]) -> None:
    """Write ``result`` but its in-memory-only keys (``params``) to ``path`` (parent
    folders created; the file replaced atomically)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump({key: value for key, value in result.items() if key not in IN_MEMORY_ONLY},
                  out, indent=1)
        out.write("\n")
    os.replace(partial, path)
