"""The single-process reference of batch optimisation (hpcreduce.train.reference): the full-batch
objective's gradient against finite differences, and scipy's L-BFGS against a closed form."""
from __future__ import annotations

import numpy as np
import pytest

from hpcreduce.train import ArrayDataset
from linear_model import LinearRegression
from hpcreduce.train.models import LogisticRegression, SyntheticCTR
from hpcreduce.train.reference import flatten, full_batch_objective, scipy_lbfgs, unflatten

pytest.importorskip("scipy")


def linear_data(n: int = 300) -> ArrayDataset:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 5))
    y = x @ np.arange(1.0, 6.0) + 0.5 + 0.1 * rng.standard_normal(n)
    return ArrayDataset("linear", {"x": x, "y": y}, {"x": x[:10], "y": y[:10]})


def finite_difference_error(objective, x: np.ndarray, coordinates: np.ndarray, h: float = 1e-6) -> float:
    """Largest gap between the objective's gradient and central differences at ``coordinates``."""
    _, g = objective(x)
    eye = np.eye(len(x))
    fd = [(objective(x + h * eye[i])[0] - objective(x - h * eye[i])[0]) / (2 * h) for i in coordinates]
    return float(np.abs(np.array(fd) - g[coordinates]).max())


def test_flatten_and_unflatten_round_trip_in_spec_order():
    model = LogisticRegression(hash_bits=3)
    params = {"weights": np.arange(8, dtype=np.float32).reshape(8, 1), "bias": np.array([9.0], np.float32)}
    x = flatten(params, model.param_specs())
    assert x.dtype == np.float64 and x.tolist() == [*range(8), 9.0]
    back = unflatten(x, model.param_specs(), like=params)
    assert back["weights"].dtype == np.float32 and back["weights"].shape == (8, 1)
    assert np.array_equal(back["bias"], params["bias"])
    assert unflatten(x, model.param_specs())["weights"].dtype == np.float64
    back["bias"][0] = -1.0
    assert x[-1] == 9.0  # copies, not views


def test_gradient_matches_finite_differences_sparse_and_dense():
    model = LogisticRegression(hash_bits=6)
    data = SyntheticCTR(0, train_examples=600, test_examples=10, fields=4, hash_bits=6)
    objective = full_batch_objective(model, data, np.arange(37, 537), l2=1e-2)
    x = np.random.default_rng(0).standard_normal(65) * 0.3
    f, g = objective(x)
    assert g.shape == x.shape and np.isfinite(f)
    assert finite_difference_error(objective, x, np.arange(0, 65, 3)) < 1e-7
    dense = full_batch_objective(LinearRegression(5), linear_data(), np.arange(300), l2=0.1)
    assert finite_difference_error(dense, np.linspace(-1, 1, 6), np.arange(6)) < 1e-6


def test_scipy_lbfgs_reaches_the_ridge_closed_form():
    data, l2 = linear_data(), 0.1
    x, f = scipy_lbfgs(LinearRegression(5), data, np.arange(300), l2, np.zeros(6), tol=1e-10)
    design = np.hstack([data.splits["train"]["x"], np.ones((300, 1))])
    exact = np.linalg.solve(design.T @ design / 300 + l2 * np.eye(6), design.T @ data.splits["train"]["y"] / 300)
    assert np.allclose(x, exact, atol=1e-7)
    objective = full_batch_objective(LinearRegression(5), data, np.arange(300), l2)
    assert f == pytest.approx(objective(exact)[0], rel=1e-12)
