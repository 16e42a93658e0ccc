"""Watching a training run: progress on the console, per-step metrics, a timeline.

    observer = Observer(ctx, config, verbose=True)          # every rank
    trainer = observer.timed(trainer, {"compute": "compute", "reduce": "communication",
                                       "apply": "compute"}, collective=("reduce",))
    ... after each committed step: log.record(...); observer.step_done(log)
    observer.finish(result.to_json)                          # collective, at the end

One rank reports (``reporter``: rank 0 in ring mode, the first worker in PS mode):

- progress (``config.progress``): ``bar``, a one-line bar redrawn in place at most ten
  times a second (step, loss, samples/s, ETA); ``lines``, a line every ~10% of the run
  (``StepLog.progress_line``); ``none``; ``auto``, a bar when stdout is a terminal and
  lines otherwise. Under Open MPI's mpirun every rank's stdout is a pseudo-terminal
  whatever mpirun writes to, so there the terminal asked about is mpirun's own stdout.
- ``config.metrics_path``: one JSON object per step (JSON lines), written as the run goes:
  step, loss, accuracy, examples, samples_per_s, step_s, wall_s, bytes_sent and
  bytes_received (this rank's, in the step), and whatever else the trainer logs
  (PS: ``read_staleness``, the largest the servers reported for the step's reads); the
  step's global batch: in hybrid mode the dense reduction sums the workers' stats; in ps
  mode a server (``lines_rank``) writes the lines from the shares the workers' CLOCKs
  carried (``train.ps.live_lines``), the reporter none.
- ``config.timeline_path``: every rank's phases, gathered to rank 0 at the end into one
  Chrome-trace file (``timeline``).
- ``config.json_path``: the result, written by rank 0 at the end (``finish``).

Files are written by ``runtime.files``'s rules (devices and FIFOs written through,
symlinks followed). A file that cannot be written does not stop the run: what can be
written still is, and ``finish`` then raises ``OutputFileError`` on every rank.

With all three off nothing is timed and ``timed`` returns the trainer itself.
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Optional

from ..errors import OutputFileError
from ..runtime.context import Context
from ..runtime.environment import detect_launcher
from ..runtime.files import LineStream, write_json
from .config import TrainConfig
from .results import StepLog
from .timeline import Timeline

RING_PHASES = {"compute": "compute", "reduce": "communication", "apply": "compute"}
BAR_WIDTH = 24
REDRAW_S = 0.1


def stdout_is_terminal(stream: IO[str] = sys.stdout) -> bool:
    """Whether what this rank prints reaches a terminal. Open MPI gives each rank a
    pseudo-terminal of its own, so under mpirun it is mpirun's (the parent's) stdout that counts."""
    if not stream.isatty():
        return False
    if detect_launcher() != "mpirun":
        return True
    try:
        return os.readlink(f"/proc/{os.getppid()}/fd/1").startswith(("/dev/pts/", "/dev/tty"))
    except OSError:
        return False


def progress_mode(requested: str, stream: IO[str] = sys.stdout) -> str:
    """``bar``, ``lines`` or ``none``: ``auto`` resolved against ``stream``."""
    if requested != "auto":
        return requested
    return "bar" if stdout_is_terminal(stream) else "lines"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_rate(per_s: float) -> str:
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if per_s >= scale:
            return f"{per_s / scale:.1f}{suffix}"
    return f"{per_s:.0f}"


class ProgressBar:
    """A one-line bar redrawn in place with a carriage return (rank 0's terminal)."""

    def __init__(self, total_steps: int, stream: IO[str] = sys.stdout):
        self.total, self.stream = total_steps, stream
        self.started = time.perf_counter()
        self.first_step: Optional[int] = None
        self.drawn = 0.0
        self.mark = (self.started, 0)
        self.visible = False

    def update(self, step: int, loss: float, examples: int) -> None:
        now = time.perf_counter()
        if self.first_step is None:
            self.first_step = step - 1
        self.mark = (self.mark[0], self.mark[1] + examples)
        if now - self.drawn < REDRAW_S and step != self.total:
            return
        done, left = step - self.first_step, self.total - step
        rate = self.mark[1] / max(now - self.mark[0], 1e-9)
        eta = (now - self.started) / max(done, 1) * left
        filled = BAR_WIDTH * step // max(self.total, 1)
        width = len(str(self.total))
        self.stream.write(f"\rstep {step:>{width}}/{self.total} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}]"
                          f" {100 * step // max(self.total, 1):3d}%  loss {loss:.4f}  "
                          f"{format_rate(rate)} samples/s  ETA {format_duration(eta)}\x1b[K")
        self.stream.flush()
        self.drawn, self.mark, self.visible = now, (now, 0), True

    def clear(self) -> None:
        """End the bar's line so that ordinary lines print below it."""
        if self.visible:
            self.stream.write("\n")
            self.stream.flush()
            self.visible = False


class Observer:
    """Progress, metrics file and timeline of one run, on one rank."""

    def __init__(self, ctx: Context, config: TrainConfig, *, verbose: bool = True, reporter: int = 0):
        self.ctx, self.config, self.verbose = ctx, config, verbose
        self.reporter = reporter
        self.lines_rank: Optional[int] = None  # ps mode: the server writing the metrics lines (``ps.live_lines``)
        self.mode = progress_mode(config.progress) if verbose else "none"
        self.bar = ProgressBar(config.steps) if self.mode == "bar" else None
        self.metrics: Optional[LineStream] = None
        self.failure: Optional[OutputFileError] = None  # the first output this rank could not write
        if config.metrics_path and self.reporting:
            self._metrics_file(fresh=True)
        self.timeline = Timeline() if config.timeline_path else None
        self.previous_wall = 0.0

    @property
    def reporting(self) -> bool:
        """Whether this rank reports now: the reporter's rank may change when ranks fail
        (``reporter`` itself is updated when PS servers are lost)."""
        return self.ctx.rank == self.reporter

    def echo(self, line: str) -> None:
        """Print ``line`` on rank 0 (when verbose), below the progress bar if one is drawn."""
        if not (self.verbose and self.ctx.rank == 0):
            return
        if self.bar:
            self.bar.clear()
        print(line, flush=True)

    def _metrics_file(self, fresh: bool = False) -> Optional[LineStream]:
        """The JSON-lines file, opened by whichever rank reports first (``fresh``: emptied;
        appended to by a rank that takes over after the reporter died); None once an
        output failed on this rank."""
        if self.metrics is None and self.config.metrics_path and self.failure is None:
            with self._keeping_failure():
                self.metrics = LineStream(self.config.metrics_path, fresh=fresh)
        return self.metrics

    def output_failed(self, err: OutputFileError) -> None:
        """An output file of this rank could not be written: ``finish`` raises ``err`` on every
        rank (the first such error); metrics are written no more."""
        self.failure = self.failure or err
        self.metrics = None

    @contextmanager
    def _keeping_failure(self) -> Iterator[None]:
        """An ``OutputFileError`` in the block is kept for ``finish``; the run goes on."""
        try:
            yield
        except OutputFileError as err:
            self.output_failed(err)

    def timed(self, target: Any, phases: Mapping[str, str], collective: Iterable[str] = ()) -> Any:
        """``target`` with the methods in ``phases`` timed on the timeline; itself when off."""
        return self.timeline.timed(target, phases, collective) if self.timeline else target

    def step_done(self, log: StepLog) -> None:
        """The step ``log`` recorded last is committed: report it."""
        row = log.rows[-1]
        if self.timeline:
            self.timeline.step_done(row["step"])
        step_s = row["wall_s"] - self.previous_wall
        self.previous_wall = row["wall_s"]
        if not self.reporting:
            return
        metrics = self._metrics_file() if self.lines_rank is None else None
        if metrics:
            with self._keeping_failure():
                metrics.write_line(json.dumps({
                    **row, "samples_per_s": row["examples"] / step_s if step_s > 0 else None,
                    "step_s": step_s, "bytes_sent": log.bytes_sent[-1],
                    "bytes_received": log.bytes_received[-1]}))
        if self.mode == "lines":
            line = log.progress_line()
            if line:
                print(line, flush=True)
        elif self.bar:
            self.bar.update(row["step"], row["loss"], row["examples"])

    def write_line(self, line: str) -> None:
        """A metrics line made elsewhere (``lines_rank``'s, ``train.ps.live_lines``), appended."""
        metrics = self._metrics_file()
        if metrics:
            with self._keeping_failure():
                metrics.write_line(line)

    def finish(self, result_json: Callable[[], Any]) -> None:
        """End the progress bar, close the metrics file, write the timeline and (rank 0)
        ``result_json()`` as the result file; collective when any output file is on. Raises
        ``OutputFileError`` on every rank if some rank could not write its file (or a PS
        server its checkpoint)."""
        if self.bar:
            self.bar.clear()
        with self._keeping_failure():
            if self.metrics:
                self.metrics.close()
            if self.timeline:
                self.timeline.write(self.ctx.comm, self.config.timeline_path)
            if self.config.json_path and self.ctx.rank == 0:
                write_json(self.config.json_path, result_json())
        if not self.config.writes_files():
            return
        failures = self.ctx.comm.allgather(self.failure.parts if self.failure else None)
        for rank, parts in enumerate(failures):
            if parts:
                raise OutputFileError(*parts, f" (on rank {rank}; what could be written was)")
