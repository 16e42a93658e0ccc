"""Fusion without copies (tests/mpi/fusion_views.py): bucket views reduced in place give the
copying path's bits, for numpy arrays and torch gradients, under real mpirun."""
import pytest

from mpi_run import mpirun


@pytest.mark.parametrize("ranks", [1, 3])
def test_bucket_views_reduce_in_place_with_the_copying_paths_bits(ranks):
    result = mpirun(ranks, "fusion_views.py", timeout=180)
    assert result.returncode == 0, result
    assert f"fusion views N={ranks}: torch " in result.output and " 0 failures" in result.output, result
