"""``hpcreduce bench stragglers``: its flags, its pure parts on made-up results, the runs it launches
for Downpour and the ring, and (once Sandblaster is in) the whole benchmark, tiny."""
from __future__ import annotations

import argparse
import json

import pytest
from mpi_run import hpcreduce_cli

from hpcreduce.benchmarks import stragglers
from hpcreduce.cli.bench_flags import stragglers_flags, stragglers_problems
from hpcreduce.train.config import MODES
from hpcreduce.train.divergence import DIVERGED_EXIT


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", "--ranks", type=int, default=4)
    parser.add_argument("--ft", action="store_true")
    stragglers_flags(parser)
    return parser.parse_args(argv)


def made_up(pass_s, units=64, backups=0, discarded=0, accuracy=0.8, train_s=1.0):
    return {"sandblaster": {"pass_s": pass_s, "units": units, "backups_issued": backups,
                            "duplicates_discarded": discarded, "units_by_worker": [32, 32]},
            "final": {"loss": 0.45, "accuracy": accuracy}, "train_s": train_s}


def test_flags_of_each_case_and_method():
    args = flags()
    assert args.ranks == 6 and stragglers_problems(args) == []
    assert stragglers.straggler_flags("none", args)[-2:] == ["--backups", "on"]
    assert stragglers.straggler_flags("slow", args)[-4:] == ["--backups", "off", "--slow", "5:4"]
    assert stragglers.straggler_flags("backups", args)[-4:] == ["--backups", "on", "--slow", "5:4"]
    lbfgs = stragglers.method_flags("lbfgs", 8, args)
    assert lbfgs[:4] == ["--mode", "sandblaster", "--optimizer", "lbfgs"] and lbfgs[-2:] == ["--steps", "8"]
    assert stragglers.method_flags("downpour", 50, args)[:6] == ["--mode", "ps", "--servers", "1", "--consistency",
                                                                 "asp"]
    assert stragglers.budgets("ring", args) == [25, 50, 100, 200, 400]
    said = stragglers_problems(flags("-n", "3", "--unit", "99999", "--lbfgs-steps", "4,0", "--methods", "sgd"))
    assert any("-n must be at least --servers + 3" in text for text in said)
    assert any("--unit (99999) must not exceed --batch" in text for text in said)
    assert any("--lbfgs-steps '4,0'" in text for text in said) and any("--methods: unknown 'sgd'" in text
                                                                          for text in said)


def test_ratios_time_to_accuracy_and_table():
    rows = stragglers.with_ratios([stragglers.straggler_row("none", made_up([0.1, 0.3, 0.2])),
                                   stragglers.straggler_row("slow", made_up([0.8, 0.8])),
                                   stragglers.straggler_row("backups", made_up([0.24], backups=5, discarded=3))])
    assert [round(row["ratio"], 6) for row in rows] == [1.0, 4.0, 1.2]
    accuracies = iter([0.70, 0.79, 0.81, 0.9])
    tried = []

    def run(steps):
        tried.append(steps)
        return made_up([], accuracy=next(accuracies), train_s=steps / 10)

    reached = stragglers.accuracy_row("ring", [10, 20, 40, 80], 0.8, run)
    assert tried == [10, 20, 40] and reached["steps"] == 40 and reached["time_s"] == 4.0
    missed = stragglers.accuracy_row("downpour", [5], 0.95, lambda steps: made_up([], accuracy=0.9))
    assert not missed["reached"] and missed["time_s"] is None and missed["best_accuracy"] == 0.9
    bound = stragglers.throughput_bound(4, 4.0)
    assert abs(bound - 4 / 3.25) < 1e-12 and abs(stragglers.throughput_bound(2, 4.0) - 1.6) < 1e-12
    table = stragglers.render({"ranks": 6, "servers": 1, "factor": 4.0, "workers": 4, "bound": bound,
                               "oversubscribed": True, "stragglers": rows, "target": 0.8, "accuracy": [reached, missed]})
    assert f"met (1.20x; {1.2 / bound:.2f}x the bound)" in table and "not reached" in table and "(oversubscribed)" in table
    out_of_reach = stragglers.render({"ranks": 4, "servers": 1, "factor": 4.0, "workers": 2, "bound": 1.6,
                                      "oversubscribed": True, "stragglers": rows, "target": 0.8, "accuracy": []})
    assert "out of reach with 2 workers (bound 1.60x)" in out_of_reach


def test_the_downpour_and_ring_runs_it_launches_give_what_it_reads(tmp_path):
    args = flags("--sgd-batch", "1024")
    for method in ("downpour", "ring"):
        path = tmp_path / f"{method}.json"
        job = hpcreduce_cli("train", "-n", "3", *stragglers.method_flags(method, 4, args), "--quiet",
                            "--json", str(path), timeout=120)
        assert job.returncode in (0, DIVERGED_EXIT), job  # 4 ASP steps may end above the start's loss
        row = stragglers.accuracy_row(method, [4], 0.5, lambda steps, p=path: json.loads(p.read_text()))
        assert row["runs"][0]["train_s"] > 0 and 0.5 < row["best_accuracy"] <= 1


@pytest.mark.skipif("sandblaster" not in MODES, reason="hpcreduce train --mode sandblaster is not in yet")
def test_the_whole_benchmark_tiny(tmp_path):
    out = tmp_path / "stragglers.json"
    job = hpcreduce_cli("bench", "stragglers", "-n", "4", "--batch", "2048", "--unit", "256", "--steps", "2",
                        "--lbfgs-steps", "2", "--methods", "lbfgs", "--target", "0.5",
                        "--json", str(out), timeout=240)
    assert job.returncode == 0, job
    result = json.loads(out.read_text())
    assert [row["case"] for row in result["stragglers"]] == ["none", "slow", "backups"]
    assert all(row["units"] >= 8 for row in result["stragglers"]) and result["stragglers"][0]["ratio"] == 1.0
    assert [row["method"] for row in result["accuracy"]] == ["lbfgs"]  # the others: the test above
    assert "time to held-out accuracy 0.5" in job.output
