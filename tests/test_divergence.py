"""Divergence (``train.divergence``): a run that ends worse than it started says so, with the likely
cause, in the final line and the JSON, and exits 5 (never 0, never relaunched); a good run does not."""
import json
import math

import pytest
from mpi_run import hpcreduce_cli

from hpcreduce.train.config import PS, Sandblaster, TrainConfig
from hpcreduce.train.divergence import DIVERGED_EXIT, verdict
from hpcreduce.train.results import FinalMetrics, TrainResult, final_line


def result_of(losses, final_loss, config=None, checksum=1.0, start_loss=2.3):
    found = TrainResult(config=config or TrainConfig(), model="m", ranks=2, worker_count=2,
                        dataset={"test_examples": 10}, steps=[{"step": t, "loss": loss, "examples": 4}
                                                             for t, loss in enumerate(losses, 1)],
                        traffic={}, staleness={"read_max": 7}, wall_s=1.0, train_s=1.0,
                        final=FinalMetrics(final_loss, 0.5, checksum))
    found.start = {"loss": start_loss, "accuracy": 0.1}
    return found


def test_a_run_that_learned_has_no_sign_of_divergence():
    assert verdict(result_of([2.3] * 10 + [0.4] * 10, 0.3)) is None
    assert verdict(result_of([2.3, 4.0, 0.2], 0.3)) is None  # a bump on the way is not a trend


@pytest.mark.parametrize("losses, final_loss, checksum, said, worse", [
    ([2.0] * 10 + [60.0] * 10, 30.0, 1.0, "held-out loss 30 above the initial model's 2.3", True),
    ([2.0, 3.0, math.nan], 1.0, 1.0, "non-finite training loss (first at step row 3)", False),
    ([2.0, 2.0], 1.0, math.inf, "non-finite held-out loss or weights", True),
    ([1.0] * 10 + [5.0] * 10, 1.0, 1.0, "training loss grew from 1 to 5", False),
])
def test_each_sign_is_named_and_only_a_model_worse_than_its_start_is_worse(losses, final_loss, checksum, said,
                                                                            worse):
    found = verdict(result_of(losses, final_loss, checksum=checksum))
    assert said in " | ".join(found["signs"]) and found["worse_than_start"] is worse, found


def test_a_run_too_short_to_judge_is_reported_but_not_worse():
    found = verdict(result_of([0.69, 1.64, 1.2], 0.75, TrainConfig(steps=3), start_loss=0.69))
    assert "held-out loss 0.75 above the initial model's 0.69" in " | ".join(found["signs"]), found
    assert found["worse_than_start"] is False, found
    broken = verdict(result_of([0.69, 1.64, 1.2], 0.75, TrainConfig(steps=3), checksum=math.nan))
    assert broken["worse_than_start"] is True, broken


def test_the_likely_cause_names_staleness_the_learning_rate_or_the_batch():
    asp = verdict(result_of([1.0], 9.0, TrainConfig(lr=0.5, optimizer="momentum",
                                                     topology=PS(consistency="asp", fetch_every=4))))
    assert asp["likely_cause"] == ("staleness under ASP (reads up to 7 clocks stale, --fetch-every 4) with learning "
                                   "rate 0.5 too high for --optimizer momentum"), asp
    assert asp["advice"].startswith("--consistency bsp") and "--lr (say 0.05) or --optimizer adagrad" in asp["advice"]
    ring = verdict(result_of([1.0], 9.0, TrainConfig(lr=3000)))
    assert ring["likely_cause"] == "learning rate 3000 too high for --optimizer adagrad", ring
    assert ring["advice"] == "a smaller --lr (say 300)", ring  # adagrad already shrinks its steps
    batch = verdict(result_of([1.0], 9.0, TrainConfig(optimizer="lbfgs", topology=Sandblaster())))
    assert "overfitting the fixed batch" in batch["likely_cause"] and "--l2" in batch["advice"], batch
    worse = result_of([1.0], 9.0)
    worse.diverged = verdict(worse)
    line = final_line(worse)
    assert "\nwarning: the model ended worse than it started: held-out loss 9 above" in line, line


def test_a_diverged_run_exits_4_with_its_cause_and_is_not_relaunched(tmp_path):
    path = tmp_path / "result.json"
    job = hpcreduce_cli("train", "-n", "2", "--model", "mlp", "--lr", "50", "--restarts", "1", "--quiet",
                        "--json", str(path), timeout=120)
    assert job.returncode == DIVERGED_EXIT, job
    assert job.output.count("hpcreduce train: mlp") == 1, job  # finished with a verdict: no restart
    assert "warning: the model ended worse than it started: held-out loss" in job.output, job
    assert "Likely cause: learning rate 50 too high for --optimizer momentum" in job.output, job
    result = json.loads(path.read_text())
    assert result["diverged"]["worse_than_start"] and result["final"]["loss"] > result["start"]["loss"], result


def test_staleness_under_asp_is_caught_and_the_same_settings_under_adagrad_are_not(tmp_path):
    common = ["train", "-n", "3", "--model", "mlp", "--mode", "ps", "--consistency", "asp", "--fetch-every", "4",
              "--quiet"]
    stale = hpcreduce_cli(*common, "--json", str(tmp_path / "stale.json"), timeout=120)
    assert stale.returncode == DIVERGED_EXIT, stale
    diverged = json.loads((tmp_path / "stale.json").read_text())["diverged"]
    assert diverged["likely_cause"].startswith("staleness under ASP (reads up to"), diverged
    calm = hpcreduce_cli(*common, "--optimizer", "adagrad", "--json", str(tmp_path / "calm.json"), timeout=120)
    assert calm.returncode == 0 and "warning" not in calm.output, calm
    result = json.loads((tmp_path / "calm.json").read_text())
    assert result["diverged"] is None and result["final"]["loss"] < result["start"]["loss"] / 5, result
