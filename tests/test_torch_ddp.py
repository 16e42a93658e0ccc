"""hpcreduce.torch.DistributedDataParallel under real mpirun (tests/mpi/torch_ddp.py): equal to one
process averaging every rank's gradient, with no_sync, unused parameters and 16-bit wires; bad
input on one rank stops every rank naming the parameter; also under --ft (ULFM, TCP)."""
import pytest

from mpi_run import mpirun

pytest.importorskip("torch")


@pytest.mark.parametrize("ranks, ft", [(2, False), (3, True)])
def test_wrapper_trains_like_one_process_and_refuses_bad_input(ranks, ft):
    job = mpirun(ranks, "torch_ddp.py", ft=ft, timeout=240)
    assert job.returncode == 0, job
    assert "torch ddp: all checks passed" in job.output, job
