"""``hpcreduce.broadcast`` under real mpirun (tests/mpi/broadcast_checks.py)."""
import pytest

from mpi_run import mpirun

CHECKS = 5


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_root_values_in_place_and_the_same_error_on_every_rank(ranks):
    result = mpirun(ranks, "broadcast_checks.py", timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == CHECKS, result


def test_the_same_errors_where_checks_travel_as_messages():
    """Under fault tolerance no shared memory is used: the check is an MPI_Allreduce."""
    result = mpirun(3, "broadcast_checks.py", ft=True, timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == CHECKS, result
