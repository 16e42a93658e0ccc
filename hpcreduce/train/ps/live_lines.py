"""``--mode ps``: the live ``--metrics`` lines of each step's global batch, written by a server.

The workers never talk to each other within a step; each one's CLOCK carries its share's
[loss sum, correct, count] and the read staleness it saw (``ps.protocol.CLOCK_STATS``), which
every server keeps (``ShardState.shares``). The rank the observer names (``Observer.lines_rank``:
the first server) writes the line of step t once the slowest live worker's clock passed t
and every live worker's share of t is in (after a push-pull, whose CLOCK follows: at the
next move). ``bytes_*`` are that server's payload bytes in the step,
``wall_s`` counts from its start, ``read_staleness`` is the largest a worker saw.
A server that takes over after the writer died goes on from the steps complete then: lines of
the steps around that loss may be missing. Cost: nothing on the wire beyond the CLOCKs' fields.
"""
from __future__ import annotations

import json
import time
from typing import Optional

from ...ps.server import NOBODY_LIVE, Server
from ..observe import Observer


class ShareLines:
    """The lines of ``steps`` steps from ``first_step`` on (a resume), from the shares the
    server of ``on_progress`` holds."""

    def __init__(self, observer: Observer, steps: int, first_step: int = 0):
        self.observer, self.steps = observer, steps
        # steps written; None on a rank that writes only once it takes over
        self.written: Optional[int] = first_step if observer.ctx.rank == observer.lines_rank else None
        self.started = time.perf_counter()
        self.previous_wall = 0.0

    def on_progress(self, server: Server, slowest: int) -> None:
        """A server's slowest live clock moved to ``slowest``: the lines of the steps now complete."""
        if self.observer.ctx.rank != self.observer.lines_rank:
            return
        complete = self.steps if slowest == NOBODY_LIVE else min(slowest, self.steps)
        if self.written is None:  # a takeover: from the steps not complete yet
            self.written = complete
        shares, workers = server.state.shares, len(server.layout.worker_ranks)
        # a push-pull moves the clock before its CLOCK brings the share: wait for every live worker's
        needed = 1 if slowest == NOBODY_LIVE else workers
        while self.written < complete and len(shares.get(self.written, ())) >= needed:
            step = self.written
            loss, correct, count = (sum(share[k] for share in shares[step].values()) for k in range(3))
            staleness = max(share[3] for share in shares[step].values())
            wall = round(time.perf_counter() - self.started, 6)
            step_s, self.previous_wall = wall - self.previous_wall, wall
            sent, received = server.state.traffic.get(step, [0, 0])
            self.observer.write_line(json.dumps({
                "step": step + 1, "loss": loss / max(count, 1.0), "accuracy": correct / max(count, 1.0),
                "examples": int(count), "wall_s": wall, "read_staleness": int(staleness),
                "samples_per_s": count / step_s if step_s > 0 else None, "step_s": step_s,
                "bytes_sent": sent, "bytes_received": received}))
            self.written = step + 1
