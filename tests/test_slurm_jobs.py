"""The batch scripts in jobs/, submitted to a real one-node Slurm with ``sbatch --wait``,
under both launchers: exit code 0, the JSON they wrote, the world size they ran with.

srun jobs use the scripts' default of 4 tasks; mpirun jobs are submitted with
``--ntasks=3`` so that the rank count is seen to follow the allocation. The selected
jobs are all submitted at once (the node has room for two at a time) and each test
checks its own.
"""
import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

JOBS = Path(__file__).resolve().parent.parent / "jobs"
LAUNCHES = {"srun": ((), 4), "mpirun": (("--ntasks=3",), 3)}
SCRIPTS = {
    "bench": ("bench_allreduce.sbatch", {"SIZES": "4K,64K",
                                         "EXTRA_ARGS": "--fusion-arrays 4 --fusion-elements 1000"}),
    "ring": ("train_ring.sbatch", {"STEPS": "5", "SEED": "1"}),
    "ps": ("train_ps.sbatch", {"STEPS": "5", "SEED": "1", "CONSISTENCY": "ssp", "STALENESS": "1"}),
}
CASES = [f"{script}-{launcher}" for script in SCRIPTS for launcher in LAUNCHES]
TIMEOUT = 300


def run_case(cluster, folder: Path, case: str):
    """Submit one job; return (its exit code, its output, the JSON file it was told to write)."""
    script, launcher = case.split("-")
    path, params = SCRIPTS[script]
    out = folder / f"{case}.json"
    env = {"LAUNCHER": launcher, "OUT": str(out), **params}
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
    assert f"{launcher} -n {ranks}" in output, output  # the script echoes its launch line
    return json.loads(out.read_text()), ranks, output


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
    servers = 1 if mode == "ps" else 0
    layout = (result["mode"], result["ranks"], result["servers"], result["workers"])
    assert layout == (mode, ranks, servers, ranks - servers), (layout, output)
    config = result["config"]  # the scripts' variables reached the command
    assert (config["steps"], config["seed"]) == (5, 1), config
    if mode == "ps":
        assert (config["consistency"], config["staleness"]) == ("ssp", 1), config


def test_job_script_rejects_an_unknown_launcher(tmp_path):
    for script, _params in SCRIPTS.values():
        done = subprocess.run(["bash", str(JOBS / script)], capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "LAUNCHER": "ssh", "OUT": str(tmp_path / "x")})
        assert done.returncode == 2, (script, done)
        assert "LAUNCHER must be srun or mpirun, not 'ssh'" in done.stderr, (script, done.stderr)
