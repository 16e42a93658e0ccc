"""hpcreduce inside real Slurm jobs: one 4-rank world under srun (PMIx) and under mpirun
in an allocation, and no launcher in the batch step itself; ``train --ft`` under srun refused."""
import json
import sys
from pathlib import Path

from mpi_run import hpcreduce_cli
from multinode import nodes
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
ft_code=0; srun -n 2 {python} -m hpcreduce train --ft --steps 2 > srun-ft.txt 2>&1 || ft_code=$?
echo "$ft_code" > srun-ft.code
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

    # --ft under srun: refused at once, saying why (Open MPI's ULFM needs its own mpirun)
    refusal = (tmp_path / "srun-ft.txt").read_text()
    assert (tmp_path / "srun-ft.code").read_text().strip() != "0", refusal
    assert refusal.count("started by srun") == 1 and "mpirun --with-ft ulfm" in refusal, refusal


def test_srun_across_two_nodes_and_a_hostfile_give_the_same_picture(slurm_cluster, tmp_path):
    srun = slurm_cluster.command(["srun", "-N", "2", "--ntasks-per-node=2", "--output", str(tmp_path / "srun-%t.json"),
                                  sys.executable, "-m", "hpcreduce", "info", "--json"], timeout=120)
    under_srun = [json.loads((tmp_path / f"srun-{rank}.json").read_text()) for rank in range(4)]
    picture = {"node1": [0, 1], "node2": [2, 3]}
    assert [info["nodes"] for info in under_srun] == [picture] * 4, srun.stdout
    assert [info["node"] for info in under_srun] == ["node1", "node1", "node2", "node2"]

    placed = nodes(tmp_path, [2, 2])
    done = hpcreduce_cli("launch", "-n", "4", "--hostfile", placed.hostfile, "--", sys.executable, "-m", "hpcreduce",
                         "info", timeout=120, env=placed.env)
    assert done.returncode == 0, done
    assert done.output.count("nodes           2 nodes: node1 (ranks 0-1), node2 (ranks 2-3)") == 4, done
