"""Whether a finished run diverged, judged once at the end from what every mode's result holds.

Signs (any one makes ``result.diverged`` a dict; None when there is none):
- non-finite held-out loss or weights (the checksum sums every weight);
- a non-finite training loss, or one that ended ``GROWTH`` times above its start (the mean
  of the last tenth of the steps against the first tenth's);
- a held-out loss above the initial model's (``result.start``, the model the run started
  from, evaluated on the same held-out split): the model ended worse than it started.
The last (or non-finite values) sets ``worse_than_start``: ``hpcreduce train`` then exits
``DIVERGED_EXIT``. A run of fewer than ``JUDGED_FROM`` steps is reported but not judged worse
for its held-out loss: adaptive optimizers overshoot in their first steps (the default logreg
run: held-out loss 0.749 after 3 steps against 0.693 at the start, 0.626 after 4). ``likely_cause`` and ``advice`` name the settings that usually cause it:
staleness under ASP/SSP, the learning rate, the optimizer. Cost: one held-out evaluation of
the initial model and one small broadcast, at the end only (nothing on the training path).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from ..runtime.context import Context
from .config import TrainConfig
from .data import Dataset
from .evaluation import evaluate_initial
from .model import Model
from .results import TrainResult

DIVERGED_EXIT = 5  # hpcreduce train: the trained model ended worse than it started (3: a deadline abort, 4: growth)
GROWTH = 2.0
JUDGED_FROM = 10  # steps: a shorter run's held-out loss may still be its first steps' overshoot
ADAPTIVE = ("adagrad",)  # step sizes that shrink by themselves: the cure for too large a step


def judge(ctx: Context, model: Model, dataset: Dataset, result: TrainResult) -> None:
    """Set ``result.start`` (the initial model's held-out loss and accuracy) and
    ``result.diverged`` on every rank alike (collective: rank 0's verdict is broadcast)."""
    loss, accuracy = evaluate_initial(ctx, model, dataset, result.config.seed)
    result.start = {"loss": loss, "accuracy": accuracy}
    result.diverged = ctx.comm.bcast(verdict(result) if ctx.rank == 0 else None, root=0)


def verdict(result: TrainResult) -> Optional[Dict[str, Any]]:
    """The signs of divergence in ``result`` (with ``result.start`` set), their likely cause
    and what to try; None when there is no sign."""
    final, start = result.final, result.start
    signs: List[str] = []
    broken = not (math.isfinite(final.loss) and math.isfinite(final.checksum))
    if broken:
        signs.append("non-finite held-out loss or weights")
    signs += _training_signs([row["loss"] for row in result.steps if row.get("examples", 1)])
    above = final.loss > start["loss"]
    worse = broken or (above and result.config.steps >= JUDGED_FROM)
    if above and not broken:
        signs.append(f"held-out loss {final.loss:.4g} above the initial model's {start['loss']:.4g} "
                     f"(accuracy {final.accuracy:.4f}, initially {start['accuracy']:.4f})"
                     + ("" if worse else f", after {result.config.steps} steps: too few to judge "
                                         f"(first steps overshoot; from {JUDGED_FROM} the run fails)"))
    if not signs:
        return None
    cause, advice = likely_cause(result.config, result.staleness)
    return {"signs": signs, "worse_than_start": worse, "likely_cause": cause, "advice": advice}


def _training_signs(losses: List[float]) -> List[str]:
    """A non-finite training loss, or one whose last tenth ended ``GROWTH`` x its first tenth."""
    if not losses:
        return []
    bad = [step for step, loss in enumerate(losses, 1) if not math.isfinite(loss)]
    if bad:
        return [f"non-finite training loss (first at step row {bad[0]})"]
    tenth = max(1, len(losses) // 10)
    first, last = sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth
    if len(losses) > 1 and last > GROWTH * first:
        return [f"training loss grew from {first:.4g} to {last:.4g}"]
    return []


def likely_cause(config: TrainConfig, staleness: Dict[str, Any]) -> tuple:
    """(the likely cause, what to try) for a run of ``config`` that diverged."""
    if config.mode == "sandblaster":
        return ("overfitting the fixed batch: the line search lowers the batch objective, not the held-out loss",
                "a larger --batch or --l2, or fewer --steps")
    step = f"learning rate {config.lr:g} too high for --optimizer {config.optimizer}"
    smaller = f"a smaller --lr (say {config.lr / 10:g})" + ("" if config.optimizer in ADAPTIVE
                                                               else " or --optimizer adagrad")
    topology = config.topology
    if config.has_servers and topology.consistency != "bsp":
        cadence = "".join(f", {flag} {value}" for flag, value in (("--fetch-every", topology.fetch_every),
                                                                  ("--push-every", topology.push_every)) if value > 1)
        stale = (f"staleness under {topology.consistency.upper()} (reads up to {staleness.get('read_max', '?')} "
                 f"clocks stale{cadence}) with {step}")
        return stale, f"--consistency bsp (or ssp with a small --staleness), {smaller}"
    return step, smaller
