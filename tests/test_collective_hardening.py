"""Bad inputs and faults in the collectives under real mpirun (tests/mpi/collective_hardening.py)."""
import time

import pytest

from mpi_run import mpirun


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_overlap_one_rank_problems_settings_and_messages(ranks):
    result = mpirun(ranks, "collective_hardening.py", timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == (9 if ranks > 1 else 4), result


def test_the_same_errors_where_checks_travel_as_messages():
    """Under fault tolerance no shared memory is used: every check is an MPI_Allreduce."""
    result = mpirun(3, "collective_hardening.py", ft=True, timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == 9, result


def test_unusable_comm_on_one_rank_ends_the_job_with_the_error():
    began = time.monotonic()
    result = mpirun(2, "collective_hardening.py", "one-bad-comm", timeout=60)
    assert result.returncode != 0, result
    assert "rank 1 passed comm='world', a str" in result.output, result
    assert "aborts the job" in result.output and "did not end the job" not in result.output, result
    assert time.monotonic() - began < 30, result


def test_torch_problems_on_one_rank_raise_everywhere():
    pytest.importorskip("torch")
    result = mpirun(2, "torch_hardening.py", timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == 3, result


def test_a_rank_waiting_in_shared_memory_keeps_mpi_messages_moving():
    """Over tcp a large message moves only while its sender calls MPI; the sender waits in the
    check's shared-memory exchange for the receiver, which waits for that message."""
    result = mpirun(2, "exchange_progress.py", timeout=60, env={"OMPI_MCA_btl": "tcp,self"})
    assert result.returncode == 0, result
    assert "exchange waits kept MPI progressing" in result.output, result
