"""``hpcreduce bench stragglers``: Sandblaster's pass time with a straggler, with and without backup
tasks, and time to a held-out accuracy of Sandblaster L-BFGS, Downpour and the ring.

Run it outside any MPI job; it launches every run itself (``hpcreduce train --json``), on
``-n`` ranks each: K = ``--servers`` servers, then (Sandblaster) one coordinator and the
other ranks workers.

1. Stragglers, three ``--mode sandblaster --optimizer lbfgs`` runs of ``--steps``
   iterations, the same in all but: ``none`` (no straggler, backups on); ``slow`` (the last
   rank, a worker, computes ``--factor`` times as long: ``--slow``, backups off);
   ``backups`` (the same straggler, backups on). Reported per case: the median of every
   pass's wall seconds (``sandblaster.pass_s``: gradient and line-search passes alike), its
   ratio to ``none`` (target: ``backups`` within 1.3x), and the work units, backups issued
   and duplicates discarded. Beside it, the bound no scheduling can beat: with W workers and
   one F times slower, the workers' throughput falls from W to W - 1 + 1/F units per unit
   time, so a pass takes at least W / (W - 1 + 1/F) times as long (1.6x at W = 2, F = 4;
   1.23x at W = 4); backups can remove the tail, not the lost throughput. The bound assumes
   a core per worker: oversubscribed (marked), a sleeping straggler gives its core to the
   others, and a run can land below it.
2. Time to accuracy, per method: ``lbfgs`` (Sandblaster L-BFGS over ``--batch`` examples
   per pass), ``downpour`` (``--mode ps --consistency asp --optimizer adagrad``) and
   ``ring`` (adagrad), all on the model's data. Held-out accuracy is measured once, at the
   end of a run (``final.accuracy``), so each method runs with growing budgets
   (``--lbfgs-steps``, ``--sgd-steps``) until a run ends at ``--target`` or above; its time to
   accuracy is that run's training seconds (``train_s``: start-up and the final
   evaluation left out). A method that never gets there reports its best accuracy.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..runtime.files import write_json
from ..train.divergence import DIVERGED_EXIT
from .scaling import Launcher

NAME = "stragglers"
HELP = "Sandblaster pass time with a slow worker (backups off/on) and time to accuracy vs Downpour and ring"
CASES = ("none", "slow", "backups")
METHODS = ("lbfgs", "downpour", "ring")
TARGET_RATIO = 1.3


def straggler_flags(case: str, args) -> List[str]:
    """The flags of one straggler case."""
    slow = ["--slow", f"{args.ranks - 1}:{args.factor:g}"] if case != "none" else []
    return [*sandblaster_flags(args), "--steps", str(args.steps), "--backups", "off" if case == "slow" else "on",
            *slow]


def sandblaster_flags(args) -> List[str]:
    """The Sandblaster runs' flags: the SGD runs' model (2**20 rows, the former --l2), not the
    batch method's own defaults, so that both methods train one model."""
    return ["--mode", "sandblaster", "--optimizer", "lbfgs", "--servers", str(args.servers),
            "--batch", str(args.batch), "--unit", str(args.unit), "--history", str(args.history),
            "--table-rows", str(1 << 20), "--l2", "1e-4"]


def method_flags(method: str, steps: int, args) -> List[str]:
    """The flags of one time-to-accuracy run of ``method`` with a budget of ``steps``."""
    if method == "lbfgs":
        return [*sandblaster_flags(args), "--steps", str(steps)]
    sgd = ["--optimizer", "adagrad", "--batch", str(args.sgd_batch), "--steps", str(steps)]
    if method == "downpour":
        return ["--mode", "ps", "--servers", str(args.servers), "--consistency", "asp", *sgd]
    return ["--mode", "ring", *sgd]


def drive(args) -> int:
    """Every run, from the driver process; prints the tables, writes --json; exit status."""
    launcher = Launcher(args)
    with tempfile.TemporaryDirectory(prefix="hpcreduce-stragglers-") as scratch:
        def train(stem: str, flags: Sequence[str]) -> Dict[str, Any]:
            path = Path(scratch) / f"{stem}.json"
            print(f"hpcreduce bench stragglers: {stem} ...", file=sys.stderr, flush=True)
            # a short budget's model may end worse than it started (exit DIVERGED_EXIT, result
            # written): a point of the time-to-accuracy curve like any other
            launcher.run(args.ranks, [sys.executable, "-m", "hpcreduce", "train", "--model", args.model,
                                      "--seed", str(args.seed), *flags, "--quiet", "--json", str(path)],
                         Path(scratch) / f"{stem}.log", accept=(0, DIVERGED_EXIT))
            return json.loads(path.read_text())

        cases = [straggler_row(case, train(f"straggler-{case}", straggler_flags(case, args))) for case in CASES]
        methods = [accuracy_row(method, budgets(method, args), args.target,
                                lambda steps, m=method: train(f"{m}-{steps}", method_flags(m, steps, args)))
                   for method in args.methods.split(",") if method]
    workers = args.ranks - args.servers - 1
    result = {"benchmark": NAME, "ranks": args.ranks, "servers": args.servers, "factor": args.factor,
              "workers": workers, "bound": throughput_bound(workers, args.factor),
              "oversubscribed": launcher.oversubscribed(args.ranks), "stragglers": with_ratios(cases),
              "target": args.target, "accuracy": methods}
    print(render(result), flush=True)
    if args.json_path:
        write_json(args.json_path, result)
    return 0


def throughput_bound(workers: int, factor: float) -> float:
    """The least pass-time ratio any schedule reaches with one of ``workers`` ``factor`` times slower."""
    return workers / (workers - 1 + 1 / factor)


def budgets(method: str, args) -> List[int]:
    return step_list(args.lbfgs_steps if method == "lbfgs" else args.sgd_steps)


def step_list(text: str) -> List[int]:
    """``2,4,8``: budgets in steps, ascending (ValueError when not positive integers)."""
    try:
        steps = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        steps = []
    if not steps or steps[0] < 1:
        raise ValueError(f"{text!r}: give step counts of at least 1, comma-separated")
    return steps


def straggler_row(case: str, result: Dict[str, Any]) -> Dict[str, Any]:
    """One straggler case from its run's JSON: median pass seconds and the unit counters."""
    block = result["sandblaster"]
    return {"case": case, "passes": len(block["pass_s"]), "median_pass_s": median(block["pass_s"]),
            "units": block["units"], "backups_issued": block["backups_issued"],
            "duplicates_discarded": block["duplicates_discarded"], "units_by_worker": block.get("units_by_worker"),
            "loss": result["final"]["loss"]}


def with_ratios(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each row with ``ratio``: its median pass time over the ``none`` case's."""
    base = next(row["median_pass_s"] for row in rows if row["case"] == "none")
    return [{**row, "ratio": row["median_pass_s"] / max(base, 1e-12)} for row in rows]


def accuracy_row(method: str, steps: Sequence[int], target: float,
                 run: Callable[[int], Dict[str, Any]]) -> Dict[str, Any]:
    """Runs of ``method`` with budgets ``steps`` (ascending) until one ends at ``target`` or above:
    its steps and training seconds; else (None) and the best accuracy seen."""
    tried: List[Dict[str, Any]] = []
    for budget in steps:
        result = run(budget)
        tried.append({"steps": budget, "accuracy": result["final"]["accuracy"], "train_s": result["train_s"]})
        if tried[-1]["accuracy"] >= target:
            break
    reached: Optional[Dict[str, Any]] = tried[-1] if tried[-1]["accuracy"] >= target else None
    return {"method": method, "runs": tried, "reached": reached is not None,
            "steps": reached["steps"] if reached else None, "time_s": reached["train_s"] if reached else None,
            "best_accuracy": max(row["accuracy"] for row in tried)}


def render(result: Dict[str, Any]) -> str:
    mark = " (oversubscribed)" if result["oversubscribed"] else ""
    lines = [f"Sandblaster L-BFGS passes on {result['ranks']} ranks ({result['servers']} server(s), 1 coordinator), "
             f"one of {result['workers']} workers {result['factor']:g}x slow{mark}; no schedule can beat "
             f"{result['bound']:.2f}x (the workers' lost throughput)",
             f"{'case':<9} {'passes':>6} {'median pass ms':>15} {'x none':>7} {'units':>7} {'backups':>8} "
             f"{'discarded':>10}"]
    for row in result["stragglers"]:
        lines.append(f"{row['case']:<9} {row['passes']:>6} {row['median_pass_s'] * 1e3:15.1f} {row['ratio']:7.2f} "
                     f"{row['units']:>7} {row['backups_issued']:>8} {row['duplicates_discarded']:>10}")
    backups = next((row for row in result["stragglers"] if row["case"] == "backups"), None)
    if backups:
        verdict = "met" if backups["ratio"] <= TARGET_RATIO else "missed"
        if result["bound"] > TARGET_RATIO:
            verdict += f", and out of reach with {result['workers']} workers (bound {result['bound']:.2f}x)"
        lines.append(f"target: backups within {TARGET_RATIO}x of no straggler: {verdict} ({backups['ratio']:.2f}x; "
                     f"{backups['ratio'] / result['bound']:.2f}x the bound)")
    lines += [f"time to held-out accuracy {result['target']:g} (training seconds of the shortest budget reaching it)",
              f"{'method':<9} {'steps':>6} {'seconds':>8} {'best accuracy':>14}"]
    for row in result["accuracy"]:
        steps, seconds = (f"{row['steps']}", f"{row['time_s']:.2f}") if row["reached"] else ("-", "not reached")
        lines.append(f"{row['method']:<9} {steps:>6} {seconds:>8} {row['best_accuracy']:14.4f}")
    return "\n".join(lines)
