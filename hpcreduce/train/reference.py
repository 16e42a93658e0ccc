"""A single-process reference for batch optimisation: the full-batch objective and scipy's L-BFGS.

The objective over examples ``indices`` with L2 weight ``l2``, of the flat float64
vector ``x`` (every parameter flattened in ``param_specs`` order, sparse tables as
dense vectors):

    f(x) = loss_sum(x) / len(indices) + 0.5 * l2 * ||x||^2,   g(x) = grad f(x)

It is what distributed batch methods (Sandblaster's L-BFGS and gradient descent) minimise,
and ``scipy_lbfgs`` gives the optimum they are checked against. The model computes in
float64 (its parameters are handed over as float64 arrays). Cost: one pass over the
examples per evaluation, in chunks of ``CHUNK``; nothing on the wire.
"""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from .data import Dataset
from .model import Model, ParamSpec, SparseRows
from .params import batch_view

CHUNK = 65536
Objective = Callable[[np.ndarray], Tuple[float, np.ndarray]]


def offsets(specs: Sequence[ParamSpec]) -> Dict[str, Tuple[int, int]]:
    """Where each parameter lies in the flat vector: name -> (start, end)."""
    found, start = {}, 0
    for spec in specs:
        end = start + int(np.prod(spec.shape))
        found[spec.name], start = (start, end), end
    return found


def flatten(params: Mapping[str, np.ndarray], specs: Sequence[ParamSpec]) -> np.ndarray:
    """Whole parameters as one float64 vector, in ``specs`` order."""
    return np.concatenate([np.asarray(params[spec.name], np.float64).reshape(-1) for spec in specs])


def unflatten(x: np.ndarray, specs: Sequence[ParamSpec],
              like: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """The parameters in ``x`` (flat, ``specs`` order), shaped by ``specs``, of the dtypes of
    ``like``'s arrays (float64 when ``like`` is None); copies, never views of ``x``."""
    where = offsets(specs)
    return {spec.name: np.array(x[slice(*where[spec.name])].reshape(spec.shape),
                                dtype=np.float64 if like is None else like[spec.name].dtype)
            for spec in specs}


def full_batch_objective(model: Model, dataset: Dataset, indices: np.ndarray, l2: float) -> Objective:
    """``objective(x) -> (f, g)`` over the training examples at ``indices`` (see the module)."""
    specs = model.param_specs()
    where = offsets(specs)
    indices = np.asarray(indices)
    count = len(indices)

    def objective(x: np.ndarray) -> Tuple[float, np.ndarray]:
        params = unflatten(x, specs)
        loss_sum, g = 0.0, np.zeros_like(x)
        for start in range(0, count, CHUNK):
            batch = dataset.batch("train", indices[start:start + CHUNK])
            output = model.loss_and_grads(batch_view(model, params, batch), batch)
            loss_sum += float(output.loss_sum)
            for spec in specs:
                grad = output.grads[spec.name]
                part = g[slice(*where[spec.name])].reshape(spec.shape)  # a view: adds land in g
                if isinstance(grad, SparseRows):
                    part[np.asarray(grad.ids)] += np.asarray(grad.values, np.float64)
                else:
                    part += np.asarray(grad, np.float64)
        g /= count
        g += l2 * x
        return loss_sum / count + 0.5 * l2 * float(x @ x), g

    return objective


def scipy_lbfgs(model: Model, dataset: Dataset, indices: np.ndarray, l2: float, x0: np.ndarray,
                tol: float, memory: int = 10, max_iterations: int = 10_000) -> Tuple[np.ndarray, float]:
    """scipy.optimize's L-BFGS-B (no bounds) on ``full_batch_objective`` from ``x0``, until
    the gradient's largest entry is at most ``tol``; returns (x, f) at the optimum found.
    Needs scipy (the ``test`` extra)."""
    from scipy.optimize import minimize

    result = minimize(full_batch_objective(model, dataset, indices, l2), np.asarray(x0, np.float64), jac=True,
                      method="L-BFGS-B", options={"gtol": tol, "ftol": 1e-15, "maxcor": memory,
                                                  "maxiter": max_iterations})
    return result.x, float(result.fun)
