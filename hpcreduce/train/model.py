"""The model interface both topologies train: named parameters and a loss with gradients.

A model declares its parameters (``ParamSpec``: dense tensors, and sparse tables whose
rows are keyed by int64 ids; the parameter server's tables are declared the same way)
and computes, for a batch, the summed loss and the summed gradients.
The trainers scale gradients by 1/global_batch, so the workers' gradients add up to
the global batch's mean gradient whatever the number of workers.

Bring your own model by implementing ``Model``: see ``hpcreduce.train.models`` for two.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from ..arrays import array_module
from ..errors import ModelError
from ..ps.tables import ParamSpec


@dataclass
class SparseRows:
    """Some rows of a sparse table: unique, sorted int64 ``ids`` and their ``values``
    (``len(ids)`` x the table's row shape)."""

    ids: np.ndarray
    values: np.ndarray


Params = Mapping[str, Union[np.ndarray, SparseRows]]
Grads = Dict[str, Union[np.ndarray, SparseRows]]


@dataclass
class StepOutput:
    """What one batch gave: summed loss and gradients (not yet divided by the batch)."""

    loss_sum: float
    grads: Grads
    correct: int
    count: int
    extra: Dict[str, Any] = field(default_factory=dict)


class Model:
    """Interface of a trainable model; subclass and implement the four methods."""

    name = "model"

    def param_specs(self) -> List[ParamSpec]:
        """The parameters, in a fixed order shared by every rank."""
        raise NotImplementedError

    def init_params(self, seed: int) -> Dict[str, np.ndarray]:
        """Initial values of every parameter (whole tables), reproducible from ``seed``."""
        raise NotImplementedError

    def rows(self, batch: Any) -> Dict[str, np.ndarray]:
        """For each sparse parameter, the unique sorted ids the batch touches."""
        return {}

    def loss_and_grads(self, params: Params, batch: Any) -> StepOutput:
        """Summed loss and gradients over ``batch``. Dense parameters come as arrays,
        sparse ones as ``SparseRows`` holding at least ``rows(batch)``; sparse gradients
        are returned as ``SparseRows`` over those same ids. The trainers check the
        gradients (``checked_grads``) before using them."""
        raise NotImplementedError


def checked_grads(model: Model, specs: Sequence[ParamSpec], output: StepOutput) -> Grads:
    """``output.grads`` when they match ``specs`` (one gradient per parameter, no other: a
    dense one an array of the parameter's shape and dtype, a sparse one ``SparseRows``
    with unique in-range ids (any int64 for a dynamic table) and values of the rows' shape and dtype); else a
    ``ModelError`` naming the model and the parameter. Cost: O(ids) for sparse ones."""
    where = f"model {model.name!r}: loss_and_grads"
    grads = getattr(output, "grads", None)
    if not isinstance(grads, Mapping):
        raise ModelError(f"{where} returned {type(output).__name__} with grads of type "
                         f"{type(grads).__name__}; expected a StepOutput whose grads map each "
                         f"parameter name to its gradient")
    names = [spec.name for spec in specs]
    missing = [name for name in names if name not in grads]
    extra = [name for name in grads if name not in names]
    if missing or extra:
        said = [f"no gradient for parameter(s) {missing}"] if missing else []
        said += [f"gradient(s) for unknown parameter(s) {extra}"] if extra else []
        raise ModelError(f"{where} returned {' and '.join(said)}; the parameters are {names}")
    for spec in specs:
        problem = gradient_problem(spec, grads[spec.name])
        if problem:
            raise ModelError(f"{where} returned a gradient for parameter {spec.name!r} that {problem}")
    return grads


def gradient_problem(spec: ParamSpec, grad: object) -> Optional[str]:
    """What is wrong with ``grad`` as the gradient of ``spec`` (None when nothing is)."""
    if spec.sparse != isinstance(grad, SparseRows):
        kind = "SparseRows(ids, values)" if spec.sparse else "an array"
        return f"is a {type(grad).__name__}; a {'sparse' if spec.sparse else 'dense'} parameter's must be {kind}"
    if not spec.sparse:
        return _array_problem("", grad, tuple(spec.shape), spec.dtype)
    ids = grad.ids
    problem = _array_problem("ids", ids, None, None)
    if problem:
        return problem
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        return f"has ids of dtype {ids.dtype} and shape {tuple(ids.shape)}; they must be 1-D integers"
    if ids.size and spec.dynamic is None and bool(((ids < 0) | (ids >= spec.shape[0])).any()):
        return f"has row ids outside [0, {spec.shape[0]})"
    if ids.size > 1 and not bool((ids[1:] > ids[:-1]).all()) and len(array_module(ids).unique(ids)) != ids.size:
        return "has repeated row ids (sum their rows into one)"
    return _array_problem("values", grad.values, (ids.size,) + tuple(spec.shape[1:]), spec.dtype)


def _array_problem(part: str, array: object, shape: Optional[tuple], dtype: Optional[str]) -> Optional[str]:
    """What is wrong with ``array`` (the gradient, or its ``part``): not an array, or not
    of ``shape`` and ``dtype`` when given."""
    has = f"has {part} of" if part else "has"
    if not all(hasattr(array, attribute) for attribute in ("shape", "dtype", "ndim")):
        return f"{has} type {type(array).__name__}, not an array"
    if shape is not None and tuple(array.shape) != shape:
        return f"{has} shape {tuple(array.shape)}; the parameter needs {shape}"
    if dtype is not None and np.dtype(array.dtype) != np.dtype(dtype):
        return f"{has} dtype {array.dtype}; the parameter is {np.dtype(dtype)}"
    return None
