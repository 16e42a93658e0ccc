"""allgatherv, alltoallv, reduce_scatter and agree under real mpirun (tests/mpi/collective_primitives.py)."""
import pytest

from mpi_run import mpirun

CHECKS = 6


@pytest.mark.parametrize("ranks", [2, 3])
def test_results_match_local_references_and_bad_input_raises_everywhere(ranks):
    result = mpirun(ranks, "collective_primitives.py", timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == CHECKS, result


def test_checks_travel_as_messages_under_fault_tolerance():
    """Under fault tolerance no shared memory is used: every agreement is an MPI_Allreduce."""
    result = mpirun(3, "collective_primitives.py", ft=True, timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == CHECKS, result


def test_a_killed_rank_is_reported_to_every_survivor():
    result = mpirun(3, "collective_primitives.py", "kill", ft=True, timeout=90)
    for survivor in (0, 1):
        assert f"rank {survivor}: dead rank reported" in result.output, result
