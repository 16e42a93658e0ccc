"""``hpcreduce bench soak``: many runs with real SIGKILLs of random victims; each must recover by itself.

Run it outside any MPI job. ``--runs`` runs are drawn from ``--seed`` (``soak_plan``): ring
or parameter server in turn; PS consistency BSP, SSP or ASP; 4 to ``-n`` ranks; 2 or 3
servers; victims one worker, one server, two at once, one during the recovery from another,
or ``--kill-random``. Each is ``hpcreduce train --ft ...`` with a timeout (a hang is a failure,
its processes are killed), then checked:

- it ended by itself with exit status 0, and left no process behind;
- it trained every step once (the JSON's ``steps``), and in PS mode exactly once held: for
  every live worker slot the pushes the servers applied equal the pushes it made;
- the kills really happened: the ids lost in the recovery events are the victims (at least one
  for ``--kill-random``), as many as the kill log (``HPCREDUCE_KILL_LOG``) lines;
- the final loss is within the tolerance of the same configuration's run without failures
  (run once, cached): 1e-4 relative for ring and BSP (summation order only), ``--tolerance``
  for SSP and ASP, whose quiet runs themselves differ with timing (docs/fault-tolerance.md).

Hard victims (``soak_plan.HARD``: a SIGSTOPped rank, a node's daemon killed, kills during growth,
replacement and leave) may end either way: recovered (exit 0 with its result, checked as above,
the victims among the ranks lost) or a clear error (a non-zero exit within the timeout, an
``hpcreduce train: error`` or ``hpcreduce: ...Error:`` line and no Python traceback). Never:
exit 0 without the result, a hang, a traceback, or a process of the run left (the run's ranks,
and its Open MPI daemons).

One line per run (configuration, victims, status, recoveries, slowest kill -> next step), then
the runs passed and failed (each failure with the command line that reproduces it) and the
slowest recovery. Every run's output and JSON stay in ``--out``. Exit status 1 if any run failed.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..ft import inject
from ..runtime.files import write_json
from ..runtime.jobs import run_job
from ..runtime.processes import processes_naming
from . import soak_plan
from .soak_faults import Nodes, Striker, two_nodes
from .soak_plan import SoakRun, command_line, draw_runs

NAME = "soak"
HELP = "many runs with random SIGKILLs: each must end by itself, exactly once, with its quiet run's loss"
EXACT_TOLERANCE = 1e-4
DEFAULT_TOLERANCE = 0.10


@dataclass
class Outcome:
    """A soak run's verdict: ``problems`` empty when it passed."""

    run: SoakRun
    command: str
    problems: List[str] = field(default_factory=list)
    recoveries_s: List[float] = field(default_factory=list)  # kill -> next completed step, per recovery
    loss: Optional[float] = None
    quiet_loss: Optional[float] = None
    wall_s: float = 0.0
    error: Optional[str] = None  # a hard victim's run that ended with a clear error: its line

    @property
    def passed(self) -> bool:
        return not self.problems


class Soak:
    """Runs and checks soak runs in ``folder``; the quiet run of each configuration is run once."""

    def __init__(self, folder: Path, args):
        self.folder, self.args = folder, args
        self.quiet: Dict[Tuple[Any, ...], Tuple[Optional[float], Optional[str]]] = {}

    def nodes(self, run: SoakRun) -> Optional[Nodes]:
        """The two nodes of a run whose daemon is the victim (None for other runs)."""
        return two_nodes(self.folder / "nodes", run.ranks)[0] if run.nodes else None

    def train_args(self, run: SoakRun, quiet: bool) -> List[str]:
        stem = self.folder / (f"quiet-{'-'.join(map(str, run.configuration))}" if quiet else f"run-{run.index:04d}")
        args = run.train_args(self.args.steps, self.args.batch, quiet=quiet, checkpoint_dir=f"{stem}.ckpt")
        nodes = None if quiet else self.nodes(run)
        hostfile = nodes.hostfile if nodes else self.args.hostfile
        metrics = ["--metrics", f"{stem}.metrics"] if run.external and not quiet else []
        return [*args, *(["--hostfile", hostfile] if hostfile else []), *metrics, "--quiet", "--json", f"{stem}.json"]

    def soak(self, run: SoakRun) -> Outcome:
        """Run ``run`` (and its quiet run, the first time) and check it."""
        quiet_loss, quiet_problem = self.quiet_loss(run)
        args = self.train_args(run, quiet=False)
        kill_log = self.folder / f"run-{run.index:04d}.kills"
        nodes = self.nodes(run)
        outcome = Outcome(run, command_line(args, str(kill_log), nodes.env if nodes else None, run.external),
                          quiet_loss=quiet_loss)
        started = time.monotonic()
        env = {"HPCREDUCE_KILL_LOG": str(kill_log), **(nodes.env if nodes else {})}
        striker = None
        if run.external:
            stem = str(self.folder / f"run-{run.index:04d}")
            striker = Striker(run.external, f"{stem}.json", f"{stem}.metrics", str(kill_log))
        returncode, data, left, output = self.execute(args, env, striker)
        outcome.wall_s = time.monotonic() - started
        killed_at = inject.kill_times(str(kill_log))
        outcome.problems = ([quiet_problem] if quiet_problem else []) + left
        if striker is not None and striker.fired is None and returncode == 0:
            outcome.problems.append(f"the run ended before the soak could {run.external.describe()}")
        if run.hard and returncode not in (0, None):
            outcome.error = clear_error(output)
            outcome.problems += [] if outcome.error else [f"exit status {returncode} without a clear error: "
                                                          f"{_last_lines(output)}"]
            return outcome
        outcome.problems += check(run, self.args.steps, returncode, data, killed_at, quiet_loss,
                                  self.args.tolerance, self.args.timeout)
        if data is not None:
            outcome.loss = data["final"]["loss"]
            outcome.recoveries_s = [s for s in recovery_times(data, killed_at) if s is not None]
        return outcome

    def quiet_loss(self, run: SoakRun) -> Tuple[Optional[float], Optional[str]]:
        """The final loss of ``run``'s configuration without failures, or why there is none."""
        if run.configuration not in self.quiet:
            returncode, data, left, _ = self.execute(self.train_args(run, quiet=True), {})
            if returncode == 0 and data is not None and not left:
                self.quiet[run.configuration] = (data["final"]["loss"], None)
            else:
                what = "timed out" if returncode is None else f"exit {returncode}"
                self.quiet[run.configuration] = (None, f"its run without failures failed ({'; '.join([what, *left])})")
        return self.quiet[run.configuration]

    def execute(self, args: Sequence[str], env: Dict[str, str], striker: Optional[Striker] = None
                ) -> Tuple[Optional[int], Optional[dict], List[str], str]:
        """Run ``hpcreduce train ARGS`` (``striker`` watching it): its exit status (None: timed
        out), its JSON, a problem if processes of it outlived it (they are killed), its output."""
        out = args[list(args).index("--json") + 1]
        stem = out[:-len(".json")]
        for stale in (out, f"{stem}.kills", f"{stem}.metrics"):  # a previous soak's, in the same --out
            if os.path.exists(stale):
                os.unlink(stale)
        shutil.rmtree(f"{stem}.ckpt", ignore_errors=True)
        if striker is not None:
            striker.start()
        try:
            with open(f"{stem}.log", "w", encoding="utf-8") as log:
                job = run_job([sys.executable, "-m", "hpcreduce", "train", *args], timeout=self.args.timeout,
                              env=env, cwd=str(self.folder), output=log)
        finally:
            if striker is not None:
                striker.stop()
        left = _end_leftovers(out, striker)
        data = json.loads(Path(out).read_text()) if job.returncode == 0 and os.path.exists(out) else None
        output = Path(f"{stem}.log").read_text(errors="replace")
        return (job.returncode, data, [f"{left} process(es) of it outlived the job (killed)"] if left else [],
                output)


def check(run: SoakRun, steps: int, returncode: Optional[int], data: Optional[dict], kill_times: Sequence[float],
          quiet_loss: Optional[float], tolerance: float, timeout: float) -> List[str]:
    """What is wrong with a finished soak run (empty: it passed)."""
    if returncode is None:
        return [f"did not end by itself within {timeout:g} s (a hang; killed)"]
    if returncode != 0:
        return [f"exit status {returncode}"]
    if data is None:
        return ["exit status 0 but no JSON written"]
    found = []
    trained = [row["step"] for row in data["steps"]]
    if trained != list(range(1, steps + 1)):
        found.append(f"trained steps {trained[:3]}...{trained[-3:]} ({len(trained)}), not 1..{steps} once each")
    found += _kill_problems(run, data, kill_times)
    if run.topology == "ps":
        found += _exactly_once_problems(data["ps"])
    found += _loss_problems(run, data["final"]["loss"], quiet_loss, tolerance)
    if any(s is None for s in recovery_times(data, kill_times)):
        found.append("a recovery was never followed by a completed step")
    return found


def _kill_problems(run: SoakRun, data: dict, kill_times: Sequence[float]) -> List[str]:
    lost = [rank for event in failures(data) for rank in event["lost"]]
    expected = run.expected_lost()
    if run.hard:  # a node's ranks die with its daemon, ranks join: the victims must be among the lost
        missed = sorted(set(expected or ()) - set(lost))
        return [f"recovered, but the victims {missed} are not among the ranks lost {sorted(lost)}"] if missed else []
    found = []
    if expected is not None and sorted(lost) != sorted(expected):
        found.append(f"ranks lost {sorted(lost)}, the victims were {sorted(expected)}")
    if expected is None and not lost:
        found.append("no rank was lost: the random kill never happened")
    if len(kill_times) != len(lost):
        found.append(f"{len(kill_times)} kill(s) in the kill log, {len(lost)} rank(s) lost in the recovery events")
    if data["ranks"] != run.ranks - len(lost):
        found.append(f"{data['ranks']} ranks at the end, {run.ranks} - {len(lost)} lost expected")
    return found


def _exactly_once_problems(ps: dict) -> List[str]:
    """Every live worker slot: applied pushes == made (acknowledged) pushes, and it made some."""
    pushes = ps["pushes"]
    if "made_per_worker" not in pushes:
        return ["no exactly-once counters in the JSON (ps.pushes.made_per_worker)"]
    live = [slot for slot, made in enumerate(pushes["made_per_worker"]) if made >= 0]
    found = [f"worker slot {slot}: servers applied {pushes['applied_per_worker'][slot]} pushes, it made "
             f"{pushes['made_per_worker'][slot]}" for slot in live
             if pushes["applied_per_worker"][slot] != pushes["made_per_worker"][slot]
             or pushes["made_per_worker"][slot] == 0]
    if not set(ps["worker_slots"]) <= set(live):
        found.append(f"worker slots {ps['worker_slots']} at the end, but only {live} have counters")
    return found


def _loss_problems(run: SoakRun, loss: float, quiet_loss: Optional[float], tolerance: float) -> List[str]:
    if not math.isfinite(loss):
        return [f"final loss {loss}"]
    if quiet_loss is None:
        return []
    allowed = tolerance_of(run, tolerance)
    off = abs(loss - quiet_loss) / abs(quiet_loss)
    if off > allowed:
        return [f"final loss {loss:.6g} is {off:.2%} off the quiet run's {quiet_loss:.6g} (tolerance {allowed:.2%})"]
    return []


def tolerance_of(run: SoakRun, tolerance: float) -> float:
    """Relative final-loss tolerance: summation order only for ring and BSP, ``tolerance`` else."""
    return EXACT_TOLERANCE if run.consistency == "bsp" else tolerance


def failures(data: dict) -> List[dict]:
    return [event for event in data.get("recovery", []) if event["kind"] == "failure"]  # none without --ft


def recovery_times(data: dict, kill_times: Sequence[float]) -> List[Optional[float]]:
    """Per failure event: the earliest kill since the previous event's next step to this one's
    next completed step (the event's own ``to_next_step_s`` when the log has none); None: no next step."""
    times: List[Optional[float]] = []
    since = -math.inf
    for event in failures(data):
        after = event.get("next_step_at")
        if after is None:
            times.append(None)
            continue
        kills = [t for t in kill_times if since < t <= after]
        times.append(after - min(kills) if kills else event["to_next_step_s"])
        since = after
    return times


def _end_leftovers(marker: str, striker: Optional[Striker] = None) -> int:
    """SIGKILL the processes whose command line names ``marker`` (this run's JSON path), and the
    Open MPI daemons of its mpirun that ``striker`` saw: none should outlive their job. How many
    there were."""
    def alive() -> List[int]:
        return processes_naming(marker) + (striker.daemons_left() if striker else [])
    left = alive()
    if left:
        time.sleep(2)  # a finished job's ranks may still be exiting
        left = alive()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


CLEAR_ERROR = re.compile(r"^hpcreduce( train)?: (rank \d+: )?(error\b|[A-Za-z]+Error: |the job did not finish: "
                         r"|a rank died during )")


def clear_error(output: str) -> Optional[str]:
    """The error line hpcreduce printed (``hpcreduce train: error ...``, the deadline watchdog's
    ``hpcreduce: DeadlineExceededError: ...``, the launcher's ``hpcreduce: the job did not
    finish: ...``, or a failed growth's ``hpcreduce: rank R: a rank died during ...``), if the
    output has one and no Python traceback."""
    if "Traceback (most recent call last)" in output:
        return None
    return next((line.strip() for line in output.splitlines() if CLEAR_ERROR.match(line.strip())), None)


def _last_lines(output: str, count: int = 3) -> str:
    return " | ".join(line.strip() for line in output.strip().splitlines()[-count:]) or "no output"



def drive(args) -> int:
    """Every run, from the driver process: one line each, the summary, --json; 1 if any failed."""
    folder = Path(args.out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    soak = Soak(folder, args)
    nodes, why = two_nodes(folder / "nodes", soak_plan.FEWEST_RANKS)
    if nodes is None:
        print(f"soak: no daemon victims: {why}", flush=True)
    runs = draw_runs(args.runs, args.seed, args.ranks, args.steps, nodes=nodes is not None)
    started = time.monotonic()
    outcomes = []
    for run in runs:
        outcomes.append(soak.soak(run))
        print(render_outcome(outcomes[-1], len(runs)), flush=True)
    result = summarise(outcomes, args, time.monotonic() - started)
    print(render(result), flush=True)
    if args.json_path:
        write_json(args.json_path, result)
    return 0 if not result["failed"] else 1


def summarise(outcomes: Sequence[Outcome], args, wall_s: float) -> Dict[str, Any]:
    slowest = max(((s, o) for o in outcomes for s in o.recoveries_s), key=lambda pair: pair[0], default=None)
    return {"benchmark": NAME, "seed": args.seed, "steps": args.steps, "wall_s": wall_s,
            "tolerance": {"ring_and_bsp": EXACT_TOLERANCE, "ssp_and_asp": args.tolerance},
            "runs": [{**asdict(o), "run": {**asdict(o.run), "describe": o.run.describe()}, "passed": o.passed}
                     for o in outcomes],
            "passed": sum(o.passed for o in outcomes),
            "failed": [{"index": o.run.index, "problems": o.problems, "command": o.command}
                       for o in outcomes if not o.passed],
            "recoveries": sum(len(o.recoveries_s) for o in outcomes),
            "slowest_recovery_s": slowest[0] if slowest else None,
            "slowest_recovery_run": slowest[1].run.describe() if slowest else None}


def render_outcome(outcome: Outcome, count: int) -> str:
    run = outcome.run
    status = "FAILED: " + "; ".join(outcome.problems) if not outcome.passed else \
        f"ok, a clear error: {outcome.error}" if outcome.error else "ok"
    slowest = f", slowest kill->next step {max(outcome.recoveries_s) * 1e3:.0f} ms" if outcome.recoveries_s else ""
    loss = "" if outcome.loss is None or outcome.quiet_loss is None else \
        f", loss {outcome.loss:.4f} vs quiet {outcome.quiet_loss:.4f}"
    recoveries = len(outcome.recoveries_s)
    return (f"[{run.index + 1:>3}/{count}] {run.describe():<52} {recoveries} recover{'y' if recoveries == 1 else 'ies'}"
            f"{slowest}{loss}, {outcome.wall_s:.1f} s: {status}")


def render(result: Dict[str, Any]) -> str:
    runs = len(result["runs"])
    lines = [f"soak: {runs} runs (seed {result['seed']}), {result['passed']} passed, {len(result['failed'])} failed, "
             f"{result['recoveries']} recoveries in {result['wall_s']:.0f} s"]
    if result["slowest_recovery_s"] is not None:
        lines.append(f"slowest recovery (kill -> next completed step): {result['slowest_recovery_s'] * 1e3:.0f} ms "
                     f"({result['slowest_recovery_run']})")
    for failed in result["failed"]:
        lines.append(f"failed run {failed['index'] + 1}: {'; '.join(failed['problems'])}\n  reproduce: "
                     f"{failed['command']}")
    return "\n".join(lines)
