"""jobs/bench_scaling.sbatch through a real one-node Slurm: the batch script runs
``hpcreduce bench scaling``, which starts every run as its own ``srun`` job step."""
import json
from pathlib import Path

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "bench_scaling.sbatch"


def test_bench_scaling_job_runs_every_step_under_srun(slurm_cluster, tmp_path):
    out = tmp_path / "scaling"
    env = {"LAUNCHER": "srun", "OUT": str(out), "STEPS": "4", "SIZES": "4K,64K",
           "EXTRA_ARGS": "--warmup 1 --predict 8,64"}
    code, output = slurm_cluster.sbatch_wait(SCRIPT, env=env, args=("--ntasks=2",), timeout=300)
    assert code == 0, output
    assert "+ hpcreduce bench scaling -n 2 --launcher srun --launcher-args=--mpi=pmix" in output, output
    result = json.loads((out / "scaling.json").read_text())
    assert [(row["topology"], row["ranks"]) for row in result["rows"]] == [("ring", 1), ("ring", 2), ("ps", 2)]
    assert result["launcher"] == "srun" and [p["ranks"] for p in result["predictions"]] == [8, 64]
    for log in ("ring-2.log", "ps-2.log", "allreduce.log"):
        assert (out / "runs" / log).read_text().startswith("$ srun -n 2 --mpi=pmix "), log
    assert (out / "scaling.png").stat().st_size > 10_000 and "Recommendation" in output, output
