"""hpcreduce.torch.DistributedDataParallel under real mpirun (tests/mpi/torch_ddp.py, torch_hooks.py): equal to one
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


@pytest.mark.parametrize("ranks, ft", [(2, False), (3, True)])
def test_comm_hooks_unused_parameters_bad_arguments_and_zero(ranks, ft):
    """tests/mpi/torch_hooks.py: built-in, user and PowerSGD hooks; a failing hook on one rank
    raises on all (checks through shared memory at 2 ranks, an allreduce under --ft); unused and
    frozen parameters as torch DDP over gloo leaves them; bad arguments on one rank; then
    ZeroRedundancyOptimizer (tests/mpi/torch_zero.py: 50 sharded Adam steps equal the unsharded
    ones to 1e-6, uneven slices at 3 ranks, state bytes about 1/N, state_dict round trip, LBFGS
    and differing groups refused)."""
    job = mpirun(ranks, "torch_hooks.py", ft=ft, timeout=240)
    assert job.returncode == 0, job
    assert "torch hooks: all checks passed" in job.output, job



def test_zero2_at_four_ranks_equals_unsharded_adam():
    """tests/mpi/torch_zero.py at 4 ranks (ZeRO-2: buckets reduce-scattered, 1/N of the
    gradients and optimizer state kept, 50 Adam steps equal to the unsharded ones to 1e-6)."""
    job = mpirun(4, "torch_zero.py", "check_sharded_adam_equals_unsharded", timeout=180)
    assert job.returncode == 0, job
    assert "ok check_sharded_adam_equals_unsharded" in job.output, job
