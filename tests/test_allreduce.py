"""Ring, recursive doubling, auto and fusion against native MPI_Allreduce under real mpirun."""
import pytest

from mpi_run import mpirun


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])  # 3: a non-power of two folded; 4: two doubling rounds
def test_every_op_dtype_size_and_algorithm_matches_native(ranks):
    result = mpirun(ranks, "allreduce_matrix.py", timeout=240)
    assert result.returncode == 0, result
    assert f"N={ranks} on 1 node(s):" in result.output and " 0 failures" in result.output, result


@pytest.mark.parametrize("ranks", [2, 3])
def test_fusion_bad_input_staging_private_communicator_and_pieces(ranks):
    result = mpirun(ranks, "collective_contracts.py", timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == 6, result


def test_one_shot_and_shared_checks_past_the_few_ranks_compared_one_by_one():
    result = mpirun(10, "one_shot_many.py", timeout=240)
    assert result.returncode == 0, result
    assert "one-shot at 10 ranks: ok" in result.output, result
