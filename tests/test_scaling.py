"""``hpcreduce bench scaling`` end to end (real runs on 1 and 3 ranks, ring and PS), and the
alpha-beta cost model's fits and formulas."""
import argparse
import csv
import json
import math
import subprocess

import pytest

from mpi_run import hpcreduce_cli

from hpcreduce.benchmarks import cost_model, scaling
from hpcreduce.cli import bench_flags
from hpcreduce.runtime.environment import usable_cores

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One tiny benchmark: ring on 1 and 3 ranks, PS (1 server, 2 workers) on 3."""
    out = tmp_path_factory.mktemp("scaling")
    job = hpcreduce_cli("bench", "scaling", "--counts", "1,3", "--steps", "5", "--warmup", "2",
                        "--sizes", "4K,64K,1M", "--predict", "8,64,1024", "--out", str(out), timeout=300)
    return job, out


def test_outputs_exist_and_efficiency_is_throughput_over_n_times_one_rank(bench):
    job, out = bench
    assert job.returncode == 0, job
    result = json.loads((out / "scaling.json").read_text())
    rows = result["rows"]
    assert [(r["topology"], r["ranks"], r["servers"], r["workers"]) for r in rows] == \
        [("ring", 1, 0, 1), ("ring", 3, 0, 3), ("ps", 3, 1, 2)], rows
    single = rows[0]["samples_per_s"]
    for row in rows:
        assert row["samples_per_s"] > 0 and row["model_step_s"] > 0, row
        assert math.isclose(row["efficiency"], row["samples_per_s"] / (row["ranks"] * single), rel_tol=1e-9), row
        assert row["oversubscribed"] == (row["ranks"] > usable_cores()), row
    ring3 = json.loads((out / "runs" / "ring-3.json").read_text())  # the rate is the run's own
    steps = ring3["steps"]
    rate = sum(s["examples"] for s in steps[2:]) / (steps[-1]["wall_s"] - steps[1]["wall_s"])
    assert math.isclose(rows[1]["samples_per_s"], rate, rel_tol=1e-9), (rows[1], rate)
    with open(out / "scaling.csv", newline="") as table:
        written = list(csv.DictReader(table))
    assert len(written) == 3
    for line in written:
        assert math.isclose(float(line["efficiency"]), float(line["samples_per_s"]) / (
            int(line["ranks"]) * float(written[0]["samples_per_s"])), rel_tol=1e-6), line
    for name in ("scaling.png", "allreduce_busbw.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
    fit_ranks = 3 if 3 <= usable_cores() else 2  # the most ranks that do not oversubscribe the cores, >= 2
    assert json.loads((out / "allreduce.json").read_text())["ranks"] == fit_ranks
    assert "efficiency" in job.output and "forecast (cost model)" in job.output, job


def test_forecast_and_recommendation(bench):
    job, out = bench
    assert job.returncode == 0, job
    result = json.loads((out / "scaling.json").read_text())
    link, costs = result["link"], result["costs"]
    assert link["alpha_s"] >= 0 and link["beta_s_per_byte"] > 0 and link["points"] == 3, link
    assert costs["ring_bytes"] >= 4 << 20 and costs["ps_bytes_fixed"] < costs["ring_bytes"], costs  # logreg: sparse
    predictions = result["predictions"]
    assert [p["ranks"] for p in predictions] == [8, 64, 1024]
    for p in predictions:
        assert p["winner"] == ("ring" if p["ring_step_s"] <= p["ps_step_s"] else "ps"), p
        assert p["ps_step_s"] <= p["ps1_step_s"] and 1 <= p["ps_servers"] < p["ranks"], p
    assert result["recommendation"].startswith("Recommendation for this model")
    assert result["recommendation"] in job.output, job
    with open(out / "predictions.csv", newline="") as table:
        assert [int(line["ranks"]) for line in csv.DictReader(table)] == [8, 64, 1024]
    over = dict(result, oversubscribed_ranks=[3])
    assert "OVERSUBSCRIBED at 3 ranks" in scaling.render(over)


def test_alpha_beta_fit_recovers_the_link():
    alpha, beta, ranks = 20e-6, 1e-9, 4
    sizes = [4096, 65536, 1 << 20, 16 << 20]
    times = [2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * n * beta for n in sizes]
    link = cost_model.fit_link(sizes, times, ranks)
    assert math.isclose(link.alpha_s, alpha, rel_tol=1e-6) and math.isclose(link.beta_s_per_byte, beta, rel_tol=1e-6)
    assert link.rms_relative_error < 1e-9
    flat = cost_model.fit_link([1000, 2000], [1e-3, 1e-3], 2)  # no size dependence: beta 0, not negative
    # Least squares leaves rounding noise (2.5e-22 s/B seen); 1e-15 s/B is a millionth of any real link's.
    assert 0 <= flat.beta_s_per_byte < 1e-15 and math.isclose(flat.alpha_s, 1e-3 / 2, rel_tol=1e-9)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        cost_model.fit_link(sizes, times, 1)


def test_step_formulas_and_best_servers():
    link = cost_model.Link(alpha_s=1e-5, beta_s_per_byte=1e-9, ranks=2, points=3, rms_relative_error=0.0)
    dense = cost_model.StepCosts(grad_fixed_s=0.0, grad_per_share_s=8e-3, apply_s=1e-3, batch=1024,
                                 ring_bytes=64e6, ps_bytes_fixed=64e6, ps_bytes_per_share=0.0)
    n = 8
    ring = 8e-3 / n + 1e-3 + 2 * (n - 1) * 1e-5 + 2 * (n - 1) / n * 64e6 * 1e-9
    assert math.isclose(cost_model.ring_step_s(dense, link, n), ring)
    workers = n - 2  # K = 2: each server takes 6 workers' halves
    ps = 8e-3 / workers + 2 * max(2 * 1e-5 + 64e6 * 1e-9, workers * 1e-5 + workers * 32e6 * 1e-9) + 1e-3 / 2
    assert math.isclose(cost_model.ps_step_s(dense, link, n, 2), ps)
    servers, best = cost_model.best_servers(dense, link, n)
    assert best == min(cost_model.ps_step_s(dense, link, n, k) for k in (1, 2, 4)) and servers in (1, 2, 4)
    tiny = cost_model.StepCosts(0.0, 1e-3, 0.0, 64, 20e3, 20e3, 0.0)  # under 64 KiB: one useful server
    assert cost_model.best_servers(tiny, link, 64)[0] == 1
    rows = cost_model.predict(dense, link, [8, 1024])
    assert all(math.isclose(r.ring_step_s, cost_model.ring_step_s(dense, link, r.ranks)) for r in rows)
    last = rows[-1]
    name = "ring AllReduce at" if last.winner == "ring" else f"a parameter server (K={last.ps_servers}) at"
    where = "8 to 1024 ranks" if rows[0].winner == last.winner else "1024 ranks"
    assert f"{name} {where} (at 1024: " in cost_model.recommend(rows, 64e6)
    with pytest.raises(ValueError, match="1 <= K < N"):
        cost_model.ps_step_s(dense, link, 4, 4)


def test_rank_counts_oversubscription_and_refusal_inside_a_job(monkeypatch, tmp_path):
    args = argparse.Namespace(counts=None, ranks=6, launcher="mpirun", launcher_args="", hostfile=None, ft=False,
                              ps=True, steps=20, warmup=3, servers=1, predict=[8], predict_nodes=[8], batch=None,
                              fit_ranks=None, timeout=600.0, out=str(tmp_path))
    assert scaling.rank_counts(args) == [1, 2, 4, 6]
    launcher = scaling.Launcher(args)
    assert launcher.oversubscribed(usable_cores() + 1) and not launcher.oversubscribed(1)
    assert bench_flags.scaling_problems(args) == []
    assert any("one at least 2" in p for p in bench_flags.scaling_problems(argparse.Namespace(**{**vars(args), "counts": [1]})))
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert any("outside mpirun and srun" in p for p in bench_flags.scaling_problems(args))


def test_a_run_past_its_timeout_is_stopped_and_named(tmp_path):
    job = hpcreduce_cli("bench", "scaling", "--counts", "1,2", "--steps", "4", "--warmup", "1",
                        "--timeout", "0.5", "--out", str(tmp_path), timeout=120)
    assert job.returncode == 1 and "timed out after 0.5 s" in job.output, job
    assert "ring-1.log" in job.output, job
    running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True, timeout=30).stdout
    assert str(tmp_path) not in running, running  # the job was ended, ranks and all
