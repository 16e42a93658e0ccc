"""Training under real mpirun: ring equivalence across rank counts, the CLI, the example."""
import json
import sys
from pathlib import Path

from mpi_run import hpcreduce_cli, mpirun, run_job

from hpcreduce.runtime.launch import build_mpirun

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_ring_training_is_the_same_on_1_2_and_3_ranks():
    job = mpirun(3, "train_equivalence.py", timeout=180)
    assert job.returncode == 0, job
    assert job.output.count("ranks vs 1") == 8, job


def test_train_cli_end_to_end_writes_the_result(tmp_path):
    path = tmp_path / "result.json"
    job = hpcreduce_cli("train", "-n", "3", "--steps", "100", "--json", str(path), timeout=180)
    assert job.returncode == 0, job
    progress = [line for line in job.output.splitlines() if line.startswith("step ")]
    assert len(progress) == 10 and progress[-1].startswith("step 100/100"), job
    assert job.output.count("final: loss") == 1, job
    result = json.loads(path.read_text())
    final, staleness, traffic = result["final"], result["staleness"], result["traffic"]
    assert set(final) >= {"loss", "accuracy", "checksum"}
    bayes = result["dataset"]["bayes_accuracy"]
    assert bayes - 0.03 < final["accuracy"] <= bayes + 0.01, (final, bayes)
    assert 0 < final["loss"] < 0.5 and isinstance(final["checksum"], float)
    assert staleness == {"read_max": 0, "read_hist": [300], "lag_hist": [300]}
    assert [len(steps) for steps in traffic["bytes_sent"]] == [100] * 3
    assert [len(steps) for steps in traffic["bytes_received"]] == [100] * 3
    assert min(min(steps) for steps in traffic["bytes_sent"]) >= 4 << 20  # the densified table
    assert result["ranks"] == result["workers"] == 3 and result["config"]["optimizer"] == "adagrad"
    assert len(result["steps"]) == 100 and result["steps"][-1]["step"] == 100
    assert result["wall_s"] > 0 and result["samples_per_s"] > 0


def test_train_cli_flag_errors_exit_2_on_every_rank():
    job = hpcreduce_cli("train", "-n", "3", "--steps", "0", "--optimizer", "rmsprop", "--model", "nope",
                        "--json", "/proc/no/result.json", timeout=60)
    assert job.returncode == 2, job
    for message in ("--steps and --batch must be at least 1", "--optimizer must be one of",
                    "--model must be one of logreg, mlp, embed, logreg-interaction, got 'nope'", "--json /proc/no/result.json"):
        assert job.output.count(f"hpcreduce train: {message}") == 1, job  # rank 0 alone prints
    # Under mpirun itself (as a Slurm script runs it) every rank must exit, none hang.
    plan = build_mpirun(3, [sys.executable, "-m", "hpcreduce", "train", "--mode", "ps", "--servers", "3"])
    job = run_job(plan.argv, timeout=60, env=plan.env)
    assert job.returncode == 2 and job.output.count("--servers K needs 1 <= K < ranks (3)") == 1, job


def test_bring_your_own_model_example_trains():
    job = mpirun(2, str(EXAMPLES / "linear_regression.py"), timeout=120)
    assert job.returncode == 0, job
    final = [line for line in job.output.splitlines() if line.startswith("final: loss")]
    assert len(final) == 1, job
    assert float(final[0].split()[2]) < 0.01, job  # noise floor 0.005
    assert "largest weight error" in job.output, job
