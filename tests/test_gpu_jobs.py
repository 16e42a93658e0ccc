"""The GPU variants of the Slurm training scripts (jobs/*_gpu.sbatch), checked without a
GPU or Slurm: they parse, request GPUs, run their CPU script's checks, and the command
they launch passes hpcreduce's flag checks; without a GPU it stops with exit 2 naming what
is missing. (Submitting them needs GPU nodes: the tests' Slurm has none.)"""
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from hpcreduce.arrays import cupy_available
from mpi_run import hpcreduce_cli

JOBS = Path(__file__).resolve().parent.parent / "jobs"
GPU_JOBS = {"train_ring_gpu.sbatch": "ring", "train_ps_gpu.sbatch": "ps"}
SRUN_STUB = '#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS_FILE"\n'  # records the launch line, starts nothing
HUNG_CONTROLLER = "#!/bin/sh\nexec sleep 600\n"  # scontrol where slurmctld is down: every call blocks


def without_a_controller(folder: Path) -> dict:
    """PATH and settings that put a blocking ``scontrol`` first (whatever this machine's Slurm does):
    the scripts' controller calls must give up after SCONTROL_TIMEOUT seconds and go on."""
    stub = folder / "scontrol"
    stub.write_text(HUNG_CONTROLLER)
    stub.chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin", "SCONTROL_TIMEOUT": "1"}


@pytest.mark.parametrize("script", sorted(GPU_JOBS))
def test_gpu_job_parses_requests_gpus_and_runs_its_cpu_scripts_checks(script, tmp_path):
    path = JOBS / script
    assert os.access(path, os.X_OK), f"{script} is not executable"
    assert subprocess.run(["bash", "-n", str(path)], timeout=30).returncode == 0
    directives = [line for line in path.read_text().splitlines() if line.startswith("#SBATCH")]
    assert any("--gpus-per-task=" in line or "--gres=gpu:" in line for line in directives), directives
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30,
                          env={**without_a_controller(tmp_path), "OUT": str(tmp_path / "x")})
    assert done.returncode == 2 and "not inside a Slurm allocation" in done.stderr, done


@pytest.mark.parametrize("script", sorted(GPU_JOBS))
def test_gpu_job_launches_train_on_the_gpu_with_flags_that_pass_the_checks(script, tmp_path):
    stub = tmp_path / "srun"
    stub.write_text(SRUN_STUB)
    stub.chmod(0o755)
    recorded = tmp_path / "srun-args"
    env = {**without_a_controller(tmp_path), "SLURM_JOB_ID": "1", "SLURM_NTASKS": "3", "LAUNCHER": "srun",
           "SRUN_ARGS_FILE": str(recorded), "OUT": str(tmp_path / "run.json"), "STEPS": "2"}
    done = subprocess.run(["bash", str(JOBS / script)], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0, done
    launched = recorded.read_text().splitlines()
    command = launched[launched.index("hpcreduce") + 1:]
    assert command[:3] == ["train", "--mode", GPU_JOBS[script]], launched
    assert command[command.index("--device") + 1] == "gpu", launched
    if cupy_available():
        pytest.skip("this machine has a GPU: the launch would train (bench/gpu_check.sh runs GPU jobs' commands)")
    result = hpcreduce_cli(*command, "-n", "3", timeout=120)
    said = [line for line in result.output.splitlines() if line.startswith("hpcreduce train:")]
    assert result.returncode == 2 and len(said) == 1, (shlex.join(command), result)
    assert "--device gpu needs cupy and a GPU on every rank" in said[0], result  # the only problem
