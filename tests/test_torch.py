"""hpcreduce.torch under real mpirun: broadcast, gradients equal numpy's, bad input, the PS
adapter (tests/mpi/torch_interop.py), and the examples train (torch_ddp.py through a SIGKILL inside
backward and a growth)."""
import sys
from pathlib import Path

import pytest

from mpi_run import hpcreduce_cli, mpirun

pytest.importorskip("torch")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = EXAMPLES / "torch_digits.py"


def test_broadcast_gradients_bad_input_and_parameter_server():
    job = mpirun(3, "torch_interop.py", timeout=180)
    assert job.returncode == 0, job
    assert "torch gradients equal numpy's on 3 ranks" in job.output, job
    assert "torch interop: all checks passed" in job.output, job


def test_example_trains_on_digits():
    job = mpirun(2, str(EXAMPLE), "--steps", "100", timeout=180)
    assert job.returncode == 0, job
    line = next(line for line in job.output.splitlines() if "held-out accuracy" in line)
    assert line.startswith("ring allreduce on 2 ranks") and float(line.split()[7]) > 0.8, job


def test_ddp_example_survives_a_kill_in_backward_and_a_growth():
    job = hpcreduce_cli("launch", "-n", "2", "--ft", "--", sys.executable, str(EXAMPLES / "torch_ddp.py"),
                        "--kill-at", "40", "--grow-at", "80", timeout=240)
    assert job.returncode == 0, job
    changes = [line for line in job.output.splitlines() if line.startswith("change of ranks:")]
    assert len(changes) == 2 and "'failure'" in changes[0] and "'growth'" in changes[1], job
    line = next(line for line in job.output.splitlines() if "held-out accuracy" in line)
    assert line.startswith("DDP wrapper on 2 ranks") and float(line.split()[7]) >= 0.97, job
