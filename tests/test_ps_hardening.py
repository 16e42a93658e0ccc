"""Hardening of the PS client and of training against bad models (tests/mpi/ps_client_hardening.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_run import mpirun

from hpcreduce.ps import PSInputError
from hpcreduce.ps.worker import checked_ids as check_ids


def test_ps_client_refuses_bad_calls_before_sending_and_bad_models_stop_every_rank():
    result = mpirun(3, "ps_client_hardening.py", timeout=240)
    assert result.returncode == 0, result.output
    for rank in range(3):
        assert f"rank {rank}: ok" in result.output, result.output


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**64 - 1), max_size=6),
       st.sampled_from(["int8", "uint8", "int32", "uint32", "int64", "uint64"]), st.integers(1, 300))
def test_ids_are_accepted_exactly_when_in_range_and_reported_as_given(values, dtype, rows):
    info = np.iinfo(dtype)
    ids = np.array([v for v in values if info.min <= v <= info.max], dtype)
    outside = [int(v) for v in ids if not 0 <= int(v) < rows]
    if outside:
        with pytest.raises(PSInputError, match=f"row id {outside[0]} out of range"):
            check_ids("pull_rows of 'emb'", ids, rows)
    else:
        checked = check_ids("pull_rows of 'emb'", ids, rows)
        assert checked.dtype == np.int64 and checked.tolist() == ids.astype(np.int64).tolist()
