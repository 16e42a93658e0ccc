"""hpcreduce.torch under real mpirun: broadcast, gradients equal numpy's, bad input, the PS
adapter (tests/mpi/torch_interop.py), and the example trains."""
from pathlib import Path

import pytest

from mpi_run import mpirun

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torch_digits.py"


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
