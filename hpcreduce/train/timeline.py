"""A Chrome-trace timeline of every rank's compute, communication and wait phases.

    timeline = Timeline()
    trainer = timeline.timed(trainer, {"compute": "compute", "reduce": "communication",
                                       "apply": "compute"}, collective=("reduce",))
    ... timeline.step_done(step) after each committed step ...
    timeline.write(comm, path)          # collective: gathered to rank 0, one file

The file is Chrome's trace-event JSON (``{"traceEvents": [...]}``, as Horovod's
timeline), for ``chrome://tracing`` or https://ui.perfetto.dev: one "X" (complete)
event per phase per step per rank, ``pid`` = rank, ``ts``/``dur`` in microseconds,
``name`` = compute, communication or wait, ``cat`` = the timed call, ``args.step``, and
``args.slowed_us`` where a straggler's injected delay (``--slow``: ``train.straggler``) lay inside.

Every event recorded between two committed steps belongs to the later one (a retried
step keeps its failed attempts, marked ``args.failed``). Wait is not measured with
extra messages: a collective call cannot finish before the last rank enters it, so at
the end each rank's collective call of a step is split into ``wait`` (until the last
rank entered it) and ``communication`` (the rest). Clocks are aligned by one barrier
at the end (all ranks leave it within a few microseconds; across nodes the clocks'
drift over the run, some ppm, adds to that). Cost when on: two ``perf_counter`` calls
and a list append per timed call; at the end one barrier and one gather of
7 float64 per event.
"""
from __future__ import annotations

import functools
import json
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime.files import atomic_file
from .straggler import injected_s

PHASES = ("compute", "communication", "wait")
PENDING = -1.0
START, END, PHASE, CALL, STEP, FAILED, SLOWED = range(7)
COLUMNS = 7


class Timed:
    """``target`` with some of its methods timed as timeline phases; every other
    attribute is the target's own."""

    def __init__(self, target: Any, wrapped: Mapping[str, Callable]):
        self._target = target
        self.__dict__.update(wrapped)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class Timeline:
    """One rank's timed calls: (start, end, phase, call, step, failed, slowed) rows."""

    def __init__(self) -> None:
        self.rows: List[List[float]] = []
        self.calls: List[str] = []
        self.collective: set = set()
        self._pending = 0

    def timed(self, target: Any, phases: Mapping[str, str], collective: Iterable[str] = ()) -> Timed:
        """``target`` whose methods named in ``phases`` record an event of that phase per call;
        the calls in ``collective`` are entered by every rank together (split into wait and
        communication at the end)."""
        unknown = sorted(set(phases.values()) - set(PHASES))
        if unknown:
            raise ValueError(f"timeline phases must be among {PHASES}, got {unknown}")
        wrapped = {}
        for method, phase in phases.items():
            if method not in self.calls:
                self.calls.append(method)
            if method in collective:
                self.collective.add(self.calls.index(method))
            wrapped[method] = self._wrap(getattr(target, method), PHASES.index(phase),
                                         self.calls.index(method))
        return Timed(target, wrapped)

    def _wrap(self, call: Callable, phase: int, call_index: int) -> Callable:
        rows = self.rows

        @functools.wraps(call)
        def timed_call(*args, **kwargs):
            start, slowed = time.perf_counter(), injected_s()
            failed = 1.0
            try:
                result = call(*args, **kwargs)
                failed = 0.0
                return result
            finally:
                rows.append([start, time.perf_counter(), phase, call_index, PENDING, failed, injected_s() - slowed])
        return timed_call

    def step_done(self, step: int) -> None:
        """Step ``step`` is committed: it owns every event since the previous one."""
        for row in self.rows[self._pending:]:
            row[STEP] = step
        self._pending = len(self.rows)

    def write(self, comm: MPI.Intracomm, path: str) -> None:
        """Gather every rank's events to rank 0 (collective), which writes ``path``."""
        comm.Barrier()
        origin = time.perf_counter()
        local = np.array(self.rows, dtype=np.float64).reshape(-1, COLUMNS)
        local[:, START:END + 1] -= origin
        collective = [self.calls[i] for i in sorted(self.collective)]
        gathered = comm.gather((local, self.calls, collective), root=0)
        if comm.Get_rank() != 0:
            return
        per_rank, calls, collective = one_naming(gathered)
        trace = {"traceEvents": chrome_events(per_rank, calls, collective),
                 "displayTimeUnit": "ms",
                 "otherData": {"ranks": len(gathered), "phases": list(PHASES),
                               "clock": "aligned by a barrier at the end of the run"}}
        with atomic_file(path) as out:
            json.dump(trace, out, separators=(",", ":"))


def one_naming(gathered: Sequence[Tuple[np.ndarray, List[str], List[str]]]
               ) -> Tuple[List[np.ndarray], List[str], set]:
    """Every rank's rows with their call codes renumbered into one list of call names
    (ranks time different calls: PS servers none, workers theirs), and the collective codes."""
    calls = list(dict.fromkeys(name for _, names, _ in gathered for name in names))
    collective = {calls.index(name) for _, _, names in gathered for name in names}
    per_rank = []
    for rows, names, _ in gathered:
        rows = rows.copy()
        if len(rows):
            rows[:, CALL] = np.array([calls.index(name) for name in names])[rows[:, CALL].astype(int)]
        per_rank.append(rows)
    return per_rank, calls, collective


def split_waits(per_rank: Sequence[np.ndarray], collective: set) -> List[np.ndarray]:
    """Each rank's rows with its last successful collective call of every step cut in two:
    wait until the last rank entered that step's call, then communication."""
    entries: Dict[float, float] = {}
    last: List[Dict[float, int]] = []
    for rows in per_rank:
        mine: Dict[float, int] = {}
        for index, row in enumerate(rows):
            if row[CALL] in collective and not row[FAILED] and row[STEP] != PENDING:
                mine[row[STEP]] = index
        for step, index in mine.items():
            entries[step] = max(entries.get(step, -np.inf), rows[index][START])
        last.append(mine)
    result = []
    for rows, mine in zip(per_rank, last):
        extra = []
        rows = rows.copy()
        for step, index in mine.items():
            start, end = rows[index][START], rows[index][END]
            cut = min(max(entries[step], start), end)
            if cut > start:
                extra.append([start, cut, PHASES.index("wait"), rows[index][CALL], step, 0.0, 0.0])
                rows[index][START] = cut
        result.append(np.concatenate([rows, np.array(extra).reshape(-1, COLUMNS)]))
    return result


def chrome_events(per_rank: Sequence[np.ndarray], calls: Sequence[str], collective: set) -> List[dict]:
    """The trace events: process names, then one "X" event per row, times in microseconds
    from the earliest event."""
    per_rank = split_waits(per_rank, collective)
    starts = [rows[:, START].min() for rows in per_rank if len(rows)]
    zero = min(starts) if starts else 0.0
    events: List[dict] = []
    for rank, rows in enumerate(per_rank):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        for row in rows[np.argsort(rows[:, START], kind="stable")]:
            args: Dict[str, Any] = {"step": int(row[STEP])}
            if row[FAILED]:
                args["failed"] = True
            if row[SLOWED]:
                args["slowed_us"] = round(row[SLOWED] * 1e6, 3)
            events.append({"name": PHASES[int(row[PHASE])], "cat": calls[int(row[CALL])], "ph": "X",
                           "ts": round((row[START] - zero) * 1e6, 3),
                           "dur": round((row[END] - row[START]) * 1e6, 3),
                           "pid": rank, "tid": 0, "args": args})
    return events
