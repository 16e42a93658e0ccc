"""The batch scripts in jobs/, submitted to the test's real two-node Slurm with
``sbatch --wait``, under both launchers across both nodes (``-N 2``, 2 tasks per node):
exit code 0, the JSON they wrote, the world size, ranks on both hostnames; the training
scripts also once on one node (``one``), and the two-node runs must match it (BSP and
ring are deterministic up to the order of floating-point sums). The selected jobs are
all submitted at once (the cluster has room for two at a time) and each test checks its own.
"""
import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

JOBS = Path(__file__).resolve().parent.parent / "jobs"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=2")
LAUNCHES = {"srun": (TWO_NODES, 4), "mpirun": (TWO_NODES, 4), "one": (("--nodes=1", "--ntasks=4"), 4)}
SCRIPTS = {
    "bench": ("bench_allreduce.sbatch", {"SIZES": "4K,64K",
                                         "EXTRA_ARGS": "--fusion-arrays 4 --fusion-elements 1000"}),
    "ring": ("train_ring.sbatch", {"STEPS": "5", "SEED": "1"}),
    "ps": ("train_ps.sbatch", {"STEPS": "5", "SEED": "1", "SERVERS": "2", "CONSISTENCY": "bsp"}),
}
CASES = [f"{script}-{launcher}" for script in SCRIPTS for launcher in LAUNCHES
         if not (script == "bench" and launcher == "one")]
TOLERANCE = 1e-5  # relative, on the loss and the parameters' checksum
TIMEOUT = 300


def run_case(cluster, folder: Path, case: str):
    """Submit one job; return (its exit code, its output, the JSON file it was told to write)."""
    script, launcher = case.split("-")
    path, params = SCRIPTS[script]
    out = folder / f"{case}.json"
    env = {"LAUNCHER": "srun" if launcher == "one" else launcher, "OUT": str(out), **params,
           "CKPT_DIR": str(folder / f"ckpt-{case}")}
    code, output = cluster.sbatch_wait(JOBS / path, env=env, args=LAUNCHES[launcher][0], timeout=TIMEOUT)
    return code, output, out


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory, request):
    """Every job case selected in this run, submitted together: {case: future}."""
    wanted = [case for case in CASES
              if any(getattr(item, "callspec", None) and item.callspec.params.get("case") == case
                     for item in request.session.items if item.module is request.module)]
    folder = tmp_path_factory.mktemp("slurm-jobs")
    pool = ThreadPoolExecutor(max_workers=max(1, len(wanted)))
    yield {case: pool.submit(run_case, slurm_cluster, folder, case) for case in wanted}
    pool.shutdown(wait=True)


def finished(submitted, case: str):
    """The JSON result of ``case``'s job, after checking it ran and wrote it; and its output."""
    code, output, out = submitted[case].result()
    launcher = case.split("-")[1]
    ranks = LAUNCHES[launcher][1]
    assert code == 0, output
    assert out.exists(), f"the job did not write {out}\n{output}"
    echoed = "srun" if launcher == "one" else launcher
    assert f"{echoed} -n {ranks}" in output, output  # the script echoes its launch line
    result = json.loads(out.read_text())
    if launcher == "one":  # either node, all four ranks on it
        assert len(result["nodes"]) == 4 and len(set(result["nodes"])) == 1, (result["nodes"], output)
    elif case.startswith("ps"):  # the servers first, one per node: ranks round-robin over the nodes
        assert result["nodes"] == ["node1", "node2", "node1", "node2"], (result["nodes"], output)
    else:  # block placement, 2 per node
        assert result["nodes"] == ["node1", "node1", "node2", "node2"], (result["nodes"], output)
    return result, ranks, output


@pytest.mark.parametrize("case", [case for case in CASES if case.startswith("bench")])
def test_bench_allreduce_job(submitted, case):
    result, ranks, output = finished(submitted, case)
    assert result["ranks"] == ranks, output
    assert {row["bytes"] for row in result["rows"]} == {4096, 65536}, result["rows"]
    assert all(row["median_s"] > 0 for row in result["rows"]), result["rows"]


@pytest.mark.parametrize("case", [case for case in CASES if not case.startswith("bench")])
def test_train_job(submitted, case):
    result, ranks, output = finished(submitted, case)
    final = result["final"]
    for key in ("loss", "accuracy", "checksum"):
        assert isinstance(final[key], (int, float)) and math.isfinite(final[key]), (key, result)
    mode = case.split("-")[0]
    servers = 2 if mode == "ps" else 0
    layout = (result["mode"], result["ranks"], result["servers"], result["workers"])
    assert layout == (mode, ranks, servers, ranks - servers), (layout, output)
    config = result["config"]  # the scripts' variables reached the command
    assert (config["steps"], config["seed"]) == (5, 1), config
    if mode == "ps":
        assert config["consistency"] == "bsp", config


@pytest.mark.parametrize("case", [case for case in CASES if not case.startswith("bench")
                                  and not case.endswith("-one")])
def test_two_nodes_train_like_one(submitted, case):
    mode = case.split("-")[0]
    if f"{mode}-one" not in submitted:
        pytest.skip(f"{mode}-one was not selected")
    two, _, output = finished(submitted, case)
    one, _, _ = finished(submitted, f"{mode}-one")
    for key in ("loss", "checksum"):
        assert math.isclose(two["final"][key], one["final"][key], rel_tol=TOLERANCE), (key, two["final"], one["final"])


def test_job_script_rejects_an_unknown_launcher(tmp_path):
    for script, _params in SCRIPTS.values():
        done = subprocess.run(["bash", str(JOBS / script)], capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "LAUNCHER": "ssh", "OUT": str(tmp_path / "x")})
        assert done.returncode == 2, (script, done)
        assert "LAUNCHER must be srun or mpirun, not 'ssh'" in done.stderr, (script, done.stderr)


def test_job_script_outside_an_allocation_says_so(tmp_path):
    for script, _params in SCRIPTS.values():
        done = subprocess.run(["bash", str(JOBS / script)], capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "x")})
        assert done.returncode == 2, (script, done)
        assert "not inside a Slurm allocation (SLURM_JOB_ID is unset)" in done.stderr, (script, done.stderr)


def test_more_ranks_than_the_allocation_or_a_node_has_is_refused(slurm_cluster):
    code, output = slurm_cluster.sbatch_wait(JOBS / "train_ring.sbatch", env={"RANKS": "4", "STEPS": "2"},
                                             args=("--nodes=2", "--ntasks=2", "--ntasks-per-node=1"), timeout=60)
    assert code == 2, output
    assert "RANKS=4 is more than the 2 tasks of this allocation (2 nodes, tasks per node 1(x2))" in output, output
    code, output = slurm_cluster.sbatch_wait(JOBS / "train_ring.sbatch", args=("--nodes=2", "--ntasks-per-node=8"),
                                             timeout=60)
    assert code != 0 and "Requested node configuration is not available" in output, output


@pytest.mark.parametrize("launcher", ["srun", pytest.param("mpirun", marks=pytest.mark.extended)])
def test_torch_distributed_job_runs_torch_ddp_over_hpcreduce_across_two_nodes(slurm_cluster, launcher):
    """jobs/torch_distributed.sbatch on both nodes: init_process_group("hpcreduce") with nothing set
    (rank 0's store reached although the node names do not resolve), torch's own DDP and HSDP
    ending on the parameters of DDP over a gloo group of the same ranks."""
    script = Path(__file__).resolve().parent / "mpi" / "c10d_torch_ddp.py"
    code, output = slurm_cluster.sbatch_wait(JOBS / "torch_distributed.sbatch", timeout=TIMEOUT, args=TWO_NODES,
                                             env={"LAUNCHER": launcher, "SCRIPT": str(script), "ARGS": "hpcreduce"})
    assert code == 0, output
    assert f"{launcher} -n 4" in output, output
    for check in ("ddp_mlp", "ddp_cnn", "hsdp_mlp"):
        assert f"ok {check} " in output, output
