"""hpcreduce inside real Slurm jobs: one 4-rank world under srun (PMIx) and under mpirun
in an allocation, and no launcher in the batch step itself."""
import json
import sys
from pathlib import Path

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

RANKS = 4

# Every place a hpcreduce command can run in a job: the batch step (no launcher),
# an srun step, and mpirun started from the batch step. Each writes `info --json`
# per rank, and the Slurm/PMI/MPI variables it saw (printed for diagnosis).
LAUNCH_JOB = """\
#!/bin/bash
#SBATCH --job-name=hpcreduce-launch
#SBATCH --nodes=1
#SBATCH --ntasks={ranks}
#SBATCH --time=3
set -euo pipefail
cd "$RESULTS"
show_env() {{ env | grep -E '^(SLURM_(STEP|PROCID|LOCALID|NTASKS|JOB_ID|NPROCS)|PMI|PMIX_RANK|OMPI_COMM|PRTE_MCA|OMPI_MCA_mpi_yield)' | sort; }}
echo "== batch step"; show_env
{python} -m hpcreduce info --json > batch.json
echo "== srun step (task 0)"; srun -n 1 bash -c "$(declare -f show_env); show_env"
srun -n {ranks} --output=srun-%t.json {python} -m hpcreduce info --json
echo "== mpirun rank 0"
mpirun --allow-run-as-root -n {ranks} bash -c "$(declare -f show_env); \\
  [ \\$OMPI_COMM_WORLD_RANK = 0 ] && show_env; {python} -m hpcreduce info --json > mpirun-\\$OMPI_COMM_WORLD_RANK.json"
"""


def _infos(results: Path, prefix: str):
    return [json.loads((results / f"{prefix}-{rank}.json").read_text()) for rank in range(RANKS)]


def test_hpcreduce_sees_one_world_under_srun_and_mpirun_in_a_job(slurm_cluster, tmp_path):
    script = tmp_path / "launch.sbatch"
    script.write_text(LAUNCH_JOB.format(ranks=RANKS, python=sys.executable))
    code, output = slurm_cluster.sbatch_wait(script, env={"RESULTS": str(tmp_path)}, timeout=180)
    assert code == 0, output
    print(output)

    batch = json.loads((tmp_path / "batch.json").read_text())
    assert (batch["launcher"], batch["ranks"]) == ("none", 1), (batch, output)

    for prefix, launcher in (("srun", "srun"), ("mpirun", "mpirun")):
        infos = _infos(tmp_path, prefix)
        seen = [(info["launcher"], info["ranks"]) for info in infos]
        assert seen == [(launcher, RANKS)] * RANKS, (prefix, seen, output)
