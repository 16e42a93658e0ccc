"""collectives/narrow.py's 16-bit conversions in one process: bfloat16 rounding equals torch's
(round to nearest even, NaN and infinities kept), float16 equals numpy's, widening is exact."""
import numpy as np
import pytest

from hpcreduce.collectives.narrow import narrowed, widen

torch = pytest.importorskip("torch")


def test_bfloat16_rounds_as_torch_and_widens_exactly():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(10_000).astype(np.float32) * 1e3,
                             np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.0e38, 1e-40, 1.00390625,
                                       1.01171875], np.float32)])
    bits = np.empty(values.size, np.uint16)
    narrowed(values, "bfloat16", bits)
    theirs = torch.from_numpy(values).to(torch.bfloat16)
    expected = theirs.view(torch.int16).numpy().view(np.uint16)
    finite = np.isfinite(values) | np.isinf(values)
    assert np.array_equal(bits[finite], expected[finite])
    assert np.isnan(widen(bits, "bfloat16")[~finite]).all()
    assert np.array_equal(widen(bits, "bfloat16")[finite], theirs.float().numpy()[finite])


def test_float16_round_trip():
    values = np.linspace(-70000, 70000, 1001, dtype=np.float32)
    bits = np.empty(values.size, np.uint16)
    narrowed(values, "float16", bits)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16).astype(np.float32)
    assert np.array_equal(widen(bits, "float16"), expected)
