"""``hpcreduce bench recovery``: time from a SIGKILL to the next completed step.

Run it outside any MPI job. For every case and rank count it launches ``hpcreduce train
--ft --kill RANK@STEP`` (a real SIGKILL of one rank) ``--repeats`` times. The victim
appends the moment it dies to a kill log (``HPCREDUCE_KILL_LOG``) just before its
SIGKILL; the survivors' JSON gives each recovery's detection, shrink and restore times
and the moment the next step completed (wall-clock, the same machine's clock). Cases:

- ``ring``: a ring rank (the last one) dies;
- ``ps-worker``: a PS worker dies (``--servers 2``);
- ``ps-server``: a PS server dies (``--servers 2``; its replica takes over, then the
  shards are rebalanced).

Reported per case and N: the median over repeats of kill -> detection, shrink, restore
and kill -> next completed step; the target is under 0.5 s at 8 ranks.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any, Dict, Sequence

from ..runtime.files import write_json
from .scaling import Launcher

NAME = "recovery"
HELP = "time from a SIGKILL to the next completed step, ring and PS, by ranks"
CASES = {
    "ring": (["--mode", "ring"], lambda ranks: ranks - 1),
    "ps-worker": (["--mode", "ps", "--servers", "2"], lambda ranks: ranks - 1),
    "ps-server": (["--mode", "ps", "--servers", "2"], lambda ranks: 1),
}
KILL_STEP = 10


def drive(args) -> int:
    """Every run, from the driver process; prints the table, writes --json; exit status."""
    counts = [int(c) for c in args.counts.split(",")]
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"hpcreduce bench recovery: unknown case(s) {unknown}; known: {', '.join(CASES)}",
              file=sys.stderr)
        return 2
    args.ft = True  # the runs recover in-job: ULFM
    launcher = Launcher(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hpcreduce-recovery-") as scratch:
        for case in cases:
            for ranks in counts:
                samples = [measure(launcher, Path(scratch), case, ranks, i, args) for i in range(args.repeats)]
                rows.append(summarise(case, ranks, samples, launcher.oversubscribed(ranks)))
    result = {"benchmark": NAME, "kill_step": KILL_STEP, "rows": rows}
    print(render(result), flush=True)
    if args.json_path:
        write_json(args.json_path, result)
    return 0


def measure(launcher: Launcher, scratch: Path, case: str, ranks: int, repeat: int, args) -> Dict[str, float]:
    """One run: the kill's times, relative to the SIGKILL."""
    flags, victim = CASES[case]
    stem = scratch / f"{case}-{ranks}-{repeat}"
    kill_log = Path(f"{stem}.kills")
    command = [sys.executable, "-m", "hpcreduce", "train", "--ft", *flags, "--steps", str(args.steps),
               "--batch", str(args.batch), "--kill", f"{victim(ranks)}@{KILL_STEP}", "--quiet",
               "--json", f"{stem}.json"]
    print(f"hpcreduce bench recovery: {case} on {ranks} ranks, run {repeat + 1} ...", file=sys.stderr, flush=True)
    launcher.run(ranks, command, Path(f"{stem}.log"), env={"HPCREDUCE_KILL_LOG": str(kill_log)})
    killed_at = float(kill_log.read_text().split()[0])
    event = next(e for e in json.loads(Path(f"{stem}.json").read_text())["recovery"] if e["kind"] == "failure")
    return {"detect_s": event["detected_at"] - killed_at, "shrink_s": event["shrink_s"],
            "restore_s": event["restore_s"], "to_next_step_s": event["next_step_at"] - killed_at}


def summarise(case: str, ranks: int, samples: Sequence[Dict[str, float]], oversubscribed: bool) -> Dict[str, Any]:
    return {"case": case, "ranks": ranks, "oversubscribed": oversubscribed, "runs": len(samples),
            **{key: median(s[key] for s in samples) for key in samples[0]},
            "worst_to_next_step_s": max(s["to_next_step_s"] for s in samples)}


def render(result: Dict[str, Any]) -> str:
    lines = [f"recovery from one SIGKILL at step {result['kill_step']} (medians; ms)",
             f"{'case':<10} {'N':>3} {'kill->detect':>13} {'shrink':>8} {'restore':>8} "
             f"{'kill->next step':>16} {'worst':>8}"]
    for row in result["rows"]:
        mark = " (oversubscribed)" if row["oversubscribed"] else ""
        lines.append(f"{row['case']:<10} {row['ranks']:>3} {row['detect_s'] * 1e3:13.1f} "
                     f"{row['shrink_s'] * 1e3:8.1f} {row['restore_s'] * 1e3:8.1f} "
                     f"{row['to_next_step_s'] * 1e3:16.1f} {row['worst_to_next_step_s'] * 1e3:8.1f}{mark}")
    return "\n".join(lines)

