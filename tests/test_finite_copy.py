"""The hierarchical allreduce's copy out with the NaN/Inf verdict in the same pass (one process)."""
import math

import numpy as np
import pytest

from hpcreduce.collectives.finite_copy import finish_sum, finish_sum_in_place
from hpcreduce.collectives.ops import OPS


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_copy_is_finish_into_bit_for_bit_and_sums_it(dtype, op):
    reduced = (np.random.default_rng(0).standard_normal(10_001) * 100).astype(dtype)
    expected, out = np.empty_like(reduced), np.empty_like(reduced)
    OPS[op].finish_into(reduced, expected, 3)
    total = finish_sum(OPS[op], reduced, out, 3)
    assert out.tobytes() == expected.tobytes()
    if np.dtype(dtype).kind == "f":
        assert total == pytest.approx(float(np.sum(expected, dtype=np.float64)), rel=1e-3, abs=1e-2)
    else:
        assert total == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_nan_or_inf_anywhere_makes_the_sum_not_finite(bad, dtype):
    reduced = np.ones(4099, dtype)
    for where in (0, 2048, 4098):
        reduced[:] = 1
        reduced[where] = bad
        assert not math.isfinite(finish_sum(OPS["mean"], reduced, np.empty_like(reduced), 2))
    reduced[:] = np.finfo(dtype).max  # float32 sums in float64: no overflow; float64's reads as "look closer"
    assert math.isfinite(finish_sum(OPS["sum"], reduced, np.empty_like(reduced), 2)) == (dtype == np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 6, 8])
def test_in_place_mean_is_numpys_division_bit_for_bit(dtype, size):
    """A power-of-two divisor is a multiplication by its reciprocal: the same bits as the division,
    subnormals, the largest values, infinities and NaN included."""
    info = np.finfo(dtype)
    values = (np.random.default_rng(size).standard_normal(10_001) * 100).astype(dtype)
    values[:8] = [info.tiny, info.tiny / 3, -info.tiny / 7, info.smallest_subnormal, info.max, -info.max, 0.0, -0.0]
    expected = values / dtype(size)
    reduced = values.copy()
    finish_sum_in_place(OPS["mean"], reduced, size)
    assert reduced.tobytes() == expected.tobytes()
    ordinary = values[8:].copy()
    assert finish_sum_in_place(OPS["mean"], ordinary, size) == pytest.approx(float(np.sum(ordinary)), rel=1e-3)
    ordinary[5000] = math.inf
    assert not math.isfinite(finish_sum_in_place(OPS["mean"], ordinary, size))
