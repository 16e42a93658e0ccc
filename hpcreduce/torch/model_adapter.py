"""``TorchModel``: a torch module as a ``hpcreduce.train`` ``Model``, so every trainer, the
fault-tolerant hybrid one included, trains it.

    module = MyRecModel()                     # PSEmbeddingBag(s) and dense layers; seed torch first
    model = TorchModel(module, loss_fn, lambda batch: {"items": batch["ids"]})
    result = hpcreduce.train.train(model, dataset, TrainConfig(topology=Hybrid(servers=2)))
    model.load(result.params)                 # the trained dense parameters into the module

The parameters: the module's trainable dense parameters (by ``named_parameters`` name, float
dtypes), then one sparse table per ``PSEmbeddingBag`` (``bag.spec``: dynamic, or fixed and
initialised from the run's seed as ``start_hybrid`` does). ``rows(batch)``: the sorted unique
ids of ``ids_of(batch)`` per table. ``loss_and_grads``: the dense arrays become the module's
parameters (``torch.from_numpy`` views, no copy), each bag reads the rows the trainer pulled
(``PSEmbeddingBag.given_rows``: it neither pulls nor pushes), ``loss_fn(module, batch)`` gives
the summed loss, its backward the gradients, returned as numpy arrays (dense) and
``SparseRows`` over the given ids (tables). The trainer then allreduces the dense gradients
among the workers and pushes the rows to the servers, and recovers from a lost worker or server.
Cost per step: the module's forward and backward, plus copies of the gradients out of torch.
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable, Dict, List, Mapping, Tuple

import numpy as np
import torch

from ..errors import ModelError
from ..ps import ParamSpec
from ..ps.init import counter_normal
from ..ps.tables import numel
from ..train.model import Model, Params, SparseRows, StepOutput
from .dtypes import NUMPY
from .embedding_bag import PSEmbeddingBag

LossFn = Callable[[torch.nn.Module, Any], Tuple[torch.Tensor, int, int]]
IdsOf = Callable[[Any], Mapping[str, Any]]
DENSE_DTYPES = {dtype: name for dtype, name in NUMPY.items() if dtype in (torch.float32, torch.float64)}


class TorchModel(Model):
    """``module`` trained by ``hpcreduce.train``. ``loss_fn(module, batch)``: (the loss summed
    over the batch, a 0-d tensor; correct predictions; examples); ``ids_of(batch)``: for each
    bag's table, the ids (any shape, int) the module's forward will look up in it. Initial
    dense values: the module's at construction (the same on every rank when torch is seeded
    alike; the hybrid trainer also gives every worker the first worker's). Bad modules (a dense
    parameter not float32/64, two bags on one table, a table named like a parameter) raise
    ``ModelError`` here."""

    def __init__(self, module: torch.nn.Module, loss_fn: LossFn, ids_of: IdsOf, *, name: str = "torch"):
        self.module, self.loss_fn, self.ids_of, self.name = module, loss_fn, ids_of, name
        self.dense = {key: param for key, param in module.named_parameters() if param.requires_grad}
        bags = [bag for bag in module.modules() if isinstance(bag, PSEmbeddingBag)]
        self.bags = {bag.table: bag for bag in bags}
        problems = _module_problems(self.dense, [bag.table for bag in bags])
        if problems:
            raise ModelError(f"TorchModel {name!r}: " + "; ".join(problems))
        self.initial = {key: param.detach().cpu().numpy().copy() for key, param in self.dense.items()}

    def param_specs(self) -> List[ParamSpec]:
        return [ParamSpec(key, tuple(param.shape), DENSE_DTYPES[param.dtype]) for key, param in self.dense.items()] \
            + [bag.spec for bag in self.bags.values()]

    def init_elements(self, seed: int, name: str, flat: np.ndarray) -> np.ndarray:
        """Elements ``flat`` of parameter ``name``: the module's initial values, or a fixed
        table's N(0, init_scale**2) draws from (seed, name, index), as ``start_hybrid``'s."""
        if name in self.initial:
            return self.initial[name].reshape(-1)[flat]
        return counter_normal(seed, name, flat, self.bags[name].init_scale)

    def init_params(self, seed: int) -> Dict[str, np.ndarray]:
        """Every parameter but the dynamic tables (their rows start on the servers), whole."""
        return {spec.name: self.init_elements(seed, spec.name, np.arange(numel(spec))).reshape(spec.shape)
                for spec in self.param_specs() if spec.dynamic is None}

    def rows(self, batch: Any) -> Dict[str, np.ndarray]:
        ids = self.ids_of(batch)
        missing = sorted(set(self.bags) - set(ids))
        if missing:
            raise ModelError(f"TorchModel {self.name!r}: ids_of(batch) gave no ids for table(s) {missing}")
        return {table: np.unique(_as_numpy(ids[table]).astype(np.int64, copy=False)) for table in self.bags}

    def loss_and_grads(self, params: Params, batch: Any) -> StepOutput:
        self._use_dense(params)
        with ExitStack() as stack, torch.enable_grad():
            given = {table: stack.enter_context(bag.given_rows(params[table].ids, params[table].values))
                     for table, bag in self.bags.items()}
            loss_sum, correct, count = self.loss_fn(self.module, batch)
            loss_sum.backward()
        grads: Dict[str, Any] = {key: _numpy_grad(param) for key, param in self.dense.items()}
        grads.update({table: SparseRows(np.asarray(params[table].ids, dtype=np.int64), _numpy_grad(rows))
                      for table, rows in given.items()})
        return StepOutput(float(loss_sum.detach()), grads, int(correct), int(count))

    def load(self, params: Mapping[str, np.ndarray]) -> None:
        """Copy the dense arrays ``params`` (a ``TrainResult.params``) into the module."""
        with torch.no_grad():
            for key, param in self.dense.items():
                param.data = torch.tensor(np.asarray(params[key]), dtype=param.dtype)

    def _use_dense(self, params: Params) -> None:
        """The module's dense parameters become views of ``params``' arrays; gradients cleared."""
        for key, param in self.dense.items():
            array = np.require(params[key], DENSE_DTYPES[param.dtype], ("C", "W"))
            param.data = torch.from_numpy(array)
            param.grad = None


def _numpy_grad(tensor: torch.Tensor) -> np.ndarray:
    """``tensor``'s gradient as a numpy array (zeros when nothing reached it)."""
    grad = tensor.grad
    if grad is None:
        return np.zeros(tuple(tensor.shape), DENSE_DTYPES[tensor.dtype])
    return grad.detach().cpu().numpy()


def _as_numpy(ids: Any) -> np.ndarray:
    return ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)


def _module_problems(dense: Mapping[str, torch.nn.Parameter], tables: List[str]) -> List[str]:
    """What keeps a module from being a ``Model``."""
    problems = [f"dense parameter {key!r} is {param.dtype}; hpcreduce trains float32 or float64"
                for key, param in dense.items() if param.dtype not in DENSE_DTYPES]
    doubled = sorted({table for table in tables if tables.count(table) > 1})
    if doubled:
        problems.append(f"tables {doubled} are named by more than one PSEmbeddingBag (use one bag for a shared table)")
    clashing = sorted(set(tables) & set(dense))
    if clashing:
        problems.append(f"tables {clashing} are named like dense parameters; rename the bags")
    return problems
