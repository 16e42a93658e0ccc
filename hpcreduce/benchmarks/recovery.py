"""``hpcreduce bench recovery``: time from a SIGKILL (or a leave or growth request) to the next completed step.

Run it outside any MPI job. For every case and rank count it launches ``hpcreduce train``
``--repeats`` times with one change of the job's ranks at step 10. A victim appends the
moment it dies to a kill log (``HPCREDUCE_KILL_LOG``) just before its SIGKILL; a leave or a
growth is timed from its event's ``requested_at``. The survivors' JSON gives each change's
detection, shrink and restore times and the moment the next step completed (wall clock,
the same machine's clock). Cases (the event timed in brackets):

- ``ring``: a ring rank (the last one) dies [failure];
- ``ps-worker``: a PS worker dies (``--servers 2``) [failure];
- ``ps-server``: a PS server dies (``--servers 2``; its replica takes over, then the
  shards are rebalanced) [failure];
- ``node-loss-ring``, ``node-loss-ps``: every rank of the hostfile's second node dies
  (``--kill-node``) [failure]; they need ``--hostfile`` with two nodes (ring) or three (PS, with
  ``--servers 3``: e.g. 3 nodes of 2 slots and ``--counts 6``, so that servers and workers
  remain) and are skipped, saying so, without;
- ``leave-ring``, ``leave-ps``: the last rank (a PS worker) leaves gracefully (``--leave``) [leave];
- ``server-growth``: a PS run with 2 servers gains one (``--grow-servers 1@10``) [server-growth];
- ``ps-fallback``: without ULFM: ``--mode ps --servers 2 --checkpoint-dir D --checkpoint-every 5
  --restarts 1`` and the last worker killed at step 12, so the job is relaunched by
  hpcreduce's own launcher (mpirun; skipped under ``--launcher srun``) and resumes from the
  checkpoint of step 10 [resume: its ``next_step_at`` is when every worker completed a step
  after resuming, the restart time measured from the kill].

Reported per case and N: the median over repeats of start -> detection, shrink, restore and
start -> next completed step, and the worst of the last; the target is under 0.5 s at 8 ranks.
A case whose run fails is reported as failed (the others still run) and the exit status is 1.
"""
from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import LaunchError
from ..ft.inject import kill_times
from ..runtime.files import write_json
from ..runtime.jobs import run_job
from ..runtime.hosts import hostfile_hosts
from .scaling import Launcher

NAME = "recovery"
HELP = "time from a SIGKILL, a leave or a growth to the next completed step, ring and PS, by ranks"
KILL_STEP = 10
FALLBACK_KILL_STEP = 12
LATEST_STEP = FALLBACK_KILL_STEP
PS = ("--mode", "ps", "--servers", "2")


@dataclass(frozen=True)
class Case:
    """``flags``: the run's; ``change(ranks, node, folder)``: the flags that change its ranks at
    the case's step (``node``: the node to lose, ``folder``: for the run's own files);
    ``event``: the recovery event's kind that is timed; ``killed``: timed from the kill log
    (else from the event's ``requested_at``); ``nodes``: the hosts its hostfile needs (0: none);
    ``fallback``: without ULFM, relaunched by hpcreduce's launcher."""

    flags: Sequence[str]
    change: Callable[[int, str, str], List[str]]
    event: str = "failure"
    killed: bool = True
    nodes: int = 0
    fallback: bool = False


CASES: Dict[str, Case] = {
    "ring": Case(("--mode", "ring"), lambda n, node, folder: ["--kill", f"{n - 1}@{KILL_STEP}"]),
    "ps-worker": Case(PS, lambda n, node, folder: ["--kill", f"{n - 1}@{KILL_STEP}"]),
    "ps-server": Case(PS, lambda n, node, folder: ["--kill", f"1@{KILL_STEP}"]),
    "node-loss-ring": Case(("--mode", "ring"), lambda n, node, folder: ["--kill-node", f"{node}@{KILL_STEP}"],
                           nodes=2),
    "node-loss-ps": Case(("--mode", "ps", "--servers", "3"),
                         lambda n, node, folder: ["--kill-node", f"{node}@{KILL_STEP}"], nodes=3),
    "leave-ring": Case(("--mode", "ring"), lambda n, node, folder: ["--leave", f"{n - 1}@{KILL_STEP}"],
                       event="leave", killed=False),
    "leave-ps": Case(PS, lambda n, node, folder: ["--leave", f"{n - 1}@{KILL_STEP}"], event="leave", killed=False),
    "server-growth": Case(PS, lambda n, node, folder: ["--grow-servers", f"1@{KILL_STEP}"], event="server-growth",
                          killed=False),
    "ps-fallback": Case(PS, lambda n, node, folder: ["--checkpoint-dir", folder, "--checkpoint-every", "5",
                                                     "--restarts", "1", "--kill", f"{n - 1}@{FALLBACK_KILL_STEP}"],
                        event="resume", fallback=True),
}


def drive(args) -> int:
    """Every run, from the driver process; prints the table, writes --json; exit status."""
    counts = [int(c) for c in args.counts.split(",")]
    cases = [c for c in args.cases.split(",") if c]
    args.ft = True  # the runs recover in-job (ULFM), ps-fallback aside
    launcher = Launcher(args)
    rows, skipped, failed = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="hpcreduce-recovery-") as scratch:
        for case in cases:
            why = skip_reason(CASES[case], args)
            if why:
                skipped[case] = why
                print(f"hpcreduce bench recovery: {case} skipped: {why}", file=sys.stderr, flush=True)
                continue
            for ranks in counts:
                try:
                    samples = [measure(launcher, Path(scratch), case, ranks, i, args) for i in range(args.repeats)]
                except LaunchError as err:  # the other cases still run
                    failed[f"{case} N={ranks}"] = str(err)
                    print(f"hpcreduce bench recovery: {case} on {ranks} ranks failed: {err}", file=sys.stderr,
                          flush=True)
                    continue
                rows.append(summarise(case, ranks, samples, launcher.oversubscribed(ranks)))
    result = {"benchmark": NAME, "kill_step": KILL_STEP, "rows": rows, "skipped": skipped, "failed": failed}
    print(render(result), flush=True)
    if args.json_path:
        write_json(args.json_path, result)
    return 1 if failed else 0


def skip_reason(case: Case, args) -> Optional[str]:
    """Why ``case`` cannot run with these flags, or None."""
    if len(_hosts(args.hostfile)) < case.nodes:
        return (f"losing a node here needs --hostfile with {case.nodes} nodes or more (several nodes on one host: "
                "an ssh agent that gives each node's daemon its own hostname, as tests/multinode.py sets up)")
    if case.fallback and args.launcher != "mpirun":
        return ("the relaunch (--restarts) is hpcreduce's own mpirun launch; under srun use "
                "jobs/train_ft.sbatch FALLBACK=1")
    return None


def _hosts(hostfile: Optional[str]) -> List[str]:
    return hostfile_hosts(hostfile) if hostfile else []


def measure(launcher: Launcher, scratch: Path, name: str, ranks: int, repeat: int, args) -> Dict[str, float]:
    """One run: the change's times, relative to the kill (or the request)."""
    case = CASES[name]
    stem = scratch / f"{name}-{ranks}-{repeat}"
    kill_log, out = Path(f"{stem}.kills"), Path(f"{stem}.json")
    victim_node = _hosts(args.hostfile)[1] if case.nodes else ""
    common = [*case.flags, "--steps", str(args.steps), "--batch", str(args.batch),
              *case.change(ranks, victim_node, f"{stem}.ckpt"), "--quiet", "--json", str(out)]
    env = {"HPCREDUCE_KILL_LOG": str(kill_log)}
    print(f"hpcreduce bench recovery: {name} on {ranks} ranks, run {repeat + 1} ...", file=sys.stderr, flush=True)
    if case.fallback:
        hostfile = ["--hostfile", args.hostfile] if args.hostfile else []
        _self_launch([sys.executable, "-m", "hpcreduce", "train", "-n", str(ranks), *hostfile, *common],
                     Path(f"{stem}.log"), env, args.timeout)
    else:
        launcher.run(ranks, [sys.executable, "-m", "hpcreduce", "train", "--ft", *common], Path(f"{stem}.log"), env)
    result = json.loads(out.read_text())
    event = next((e for e in result["recovery"] if e["kind"] == case.event), None)
    if event is None:
        raise LaunchError(f"bench recovery {name} on {ranks} ranks: the run has no {case.event!r} event (its events: "
                          f"{[e['kind'] for e in result['recovery']]}; its ranks' nodes: {result.get('nodes')})")
    kills = kill_times(str(kill_log)) if case.killed else []
    start = min(kills, default=None) if case.killed else event.get("requested_at")
    if start is None or event.get("next_step_at") is None:
        origin = "kill in the kill log" if case.killed else "requested_at"
        raise LaunchError(f"bench recovery {name} on {ranks} ranks: no {origin} or no next_step_at in its "
                          f"{case.event!r} event: {event}")
    return {"detect_s": event["detected_at"] - start, "shrink_s": event.get("shrink_s") or 0.0,
            "restore_s": event.get("restore_s") or 0.0, "to_next_step_s": event["next_step_at"] - start}


def _self_launch(command: Sequence[str], log: Path, env: Dict[str, str], timeout: float) -> None:
    """Run ``hpcreduce train -n N ...`` outside MPI (it launches mpirun and relaunches it on failure)."""
    with open(log, "w", encoding="utf-8") as out:
        job = run_job(command, timeout=timeout, env=env, output=out)
    if job.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-15:])
        what = f"timed out after {timeout:g} s" if job.timed_out else f"exited {job.returncode}"
        raise LaunchError(f"{job.command} {what}; its output ({log}) ends:\n{tail}")


def summarise(case: str, ranks: int, samples: Sequence[Dict[str, float]], oversubscribed: bool) -> Dict[str, Any]:
    return {"case": case, "ranks": ranks, "oversubscribed": oversubscribed, "runs": len(samples),
            **{key: median(s[key] for s in samples) for key in samples[0]},
            "worst_to_next_step_s": max(s["to_next_step_s"] for s in samples)}


def render(result: Dict[str, Any]) -> str:
    lines = [f"recovery from a SIGKILL, leave or growth at step {result['kill_step']} "
             f"(ps-fallback: kill at {FALLBACK_KILL_STEP}; medians; ms from the kill or request)",
             f"{'case':<15} {'N':>3} {'->detect':>9} {'shrink':>8} {'restore':>8} "
             f"{'->next step':>12} {'worst':>8}"]
    for row in result["rows"]:
        mark = " (oversubscribed)" if row["oversubscribed"] else ""
        lines.append(f"{row['case']:<15} {row['ranks']:>3} {row['detect_s'] * 1e3:9.1f} "
                     f"{row['shrink_s'] * 1e3:8.1f} {row['restore_s'] * 1e3:8.1f} "
                     f"{row['to_next_step_s'] * 1e3:12.1f} {row['worst_to_next_step_s'] * 1e3:8.1f}{mark}")
    lines += [f"{case:<15} skipped: {why}" for case, why in result["skipped"].items()]
    lines += [f"{case:<15} FAILED: {why.splitlines()[0][:200]}" for case, why in result["failed"].items()]
    return "\n".join(lines)
