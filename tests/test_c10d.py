"""The torch.distributed backend "hpcreduce" under real mpirun (tests/mpi/c10d_checks.py): every operation and
dtype against local references, async Work, groups and DeviceMesh, bad input, a SIGKILLed rank."""
import pytest

from mpi_run import mpirun

pytest.importorskip("torch")
CHECKS = 10


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_operation_matches_a_local_reference_and_bad_input_raises_everywhere(ranks):
    result = mpirun(ranks, "c10d_checks.py", timeout=240)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == CHECKS, result


def test_a_killed_rank_fails_every_pending_and_later_work_naming_it():
    result = mpirun(3, "c10d_checks.py", "kill", ft=True, timeout=120)
    for survivor in (0, 1):
        assert f"rank {survivor}: every Work failed naming rank 2" in result.output, result


def test_a_world_size_unlike_mpis_is_refused_on_every_rank():
    result = mpirun(2, "c10d_checks.py", "world-size", timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("refused: world size 7") == 2, result
