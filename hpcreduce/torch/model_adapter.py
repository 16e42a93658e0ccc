"""``TorchModel``: a torch module as a ``hpcreduce.train`` ``Model``, so every trainer, the
fault-tolerant hybrid one included, trains it.

    module = MyRecModel()                     # an EmbeddingBagCollection and dense layers; seed torch first
    model = TorchModel(module, loss_fn, lambda batch: batch_features(batch))   # -> KeyedJaggedTensor
    result = hpcreduce.train.train(model, dataset, TrainConfig(topology=Hybrid(servers=2)))
    model.load(result.params)                 # the trained dense parameters into the module

The parameters: the module's trainable dense parameters (by ``named_parameters`` name, float
dtypes), then the tables of its ``EmbeddingBagCollection`` (``EmbeddingBagConfig.spec``:
dynamic, or fixed and initialised as ``start_hybrid`` initialises them: from the run's seed, or
by the config's ``init_fn`` on each server's shard of rows, so then from torch's random state on
the server ranks, as TorchRec's are; ``part_init``).
``rows(batch)``: per table, the sorted unique ids of ``features_of(batch)`` (the collection's
own check and deduplication). ``loss_and_grads``: the dense arrays become the module's
parameters (``torch.from_numpy`` views, no copy), the collection reads the rows the trainer
pulled (``EmbeddingBagCollection.given_rows``: it neither pulls nor pushes), ``loss_fn(module,
batch)`` gives the summed loss, its backward the gradients, returned as numpy arrays (dense)
and ``SparseRows`` over the given ids (tables). The trainer then allreduces the dense gradients
among the workers and pushes the rows to the servers, and recovers from a lost worker or server.
Cost per step: the module's forward and backward, plus copies of the gradients out of torch.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import numpy as np
import torch

from ..errors import ModelError, PSInputError
from ..ps import ParamSpec
from ..ps.init import PartInit
from ..ps.tables import numel
from ..train.model import Model, Params, SparseRows, StepOutput
from .dtypes import NUMPY
from .embedding_collection import EmbeddingBagCollection
from .embedding_configs import init_fn_problem
from .jagged import KeyedJaggedTensor
from .layouts import TableInit

LossFn = Callable[[torch.nn.Module, Any], Tuple[torch.Tensor, int, int]]
FeaturesOf = Callable[[Any], KeyedJaggedTensor]
DENSE_DTYPES = {dtype: name for dtype, name in NUMPY.items() if dtype in (torch.float32, torch.float64)}


class TorchModel(Model):
    """``module`` trained by ``hpcreduce.train``. ``loss_fn(module, batch)``: (the loss summed
    over the batch, a 0-d tensor; correct predictions; examples); ``features_of(batch)``: the
    batch's ``KeyedJaggedTensor`` (what the module's forward gives its collection). ``seed``:
    the dynamic tables' (their rows start from it on the servers). Initial dense values: the
    module's at construction; every rank starts from one model whatever its own random state (the
    hybrid trainer gives every worker the first worker's, the ring trainer rank 0's). Bad modules (a dense parameter not
    float32/64, no collection or two, a table named like a parameter, an ``init_fn`` that does
    not fill the tensor it is given) raise ``ModelError`` here."""

    def __init__(self, module: torch.nn.Module, loss_fn: LossFn, features_of: FeaturesOf, *, name: str = "torch",
                 seed: int = 0):
        self.module, self.loss_fn, self.features_of, self.name, self.seed = module, loss_fn, features_of, name, seed
        self.dense = {key: param for key, param in module.named_parameters() if param.requires_grad}
        collections = [m for m in module.modules() if isinstance(m, EmbeddingBagCollection)]
        problems = _module_problems(self.dense, collections)
        if problems:
            raise ModelError(f"TorchModel {name!r}: " + "; ".join(problems))
        self.collection = collections[0]
        self.tables = [config.name for config in self.collection.embedding_bag_configs()]
        self.initial = {key: param.detach().cpu().numpy().copy() for key, param in self.dense.items()}

    def param_specs(self) -> List[ParamSpec]:
        return [ParamSpec(key, tuple(param.shape), DENSE_DTYPES[param.dtype]) for key, param in self.dense.items()] \
            + self.collection.specs(self.seed)

    def part_init(self, seed: int, specs: Sequence[ParamSpec]) -> PartInit:
        """The initial values of ``specs`` (this model's) by part, as the servers make their shards:
        the module's dense values, and the fixed tables as ``start_hybrid`` makes them."""
        return ModuleInit(self.initial, TableInit(self.collection.embedding_bag_configs(), seed), specs)

    def init_params(self, seed: int) -> Dict[str, np.ndarray]:
        """Every parameter but the dynamic tables (their rows start on the servers), whole."""
        specs = self.param_specs()
        init = self.part_init(seed, specs)
        return {spec.name: init.rows(t, np.arange(spec.shape[0])) if spec.sparse else
                init.dense(t, 0, numel(spec)).reshape(spec.shape)
                for t, spec in enumerate(specs) if spec.dynamic is None}

    def rows(self, batch: Any) -> Dict[str, np.ndarray]:
        try:
            routed = self.collection.plan(self.features_of(batch))
        except PSInputError as err:
            raise ModelError(f"TorchModel {self.name!r}: features_of(batch): {err}") from None
        return {table: part.unique.numpy() for table, part in routed.tables.items()}

    def loss_and_grads(self, params: Params, batch: Any) -> StepOutput:
        self._use_dense(params)
        with self.collection.given_rows({t: (params[t].ids, params[t].values) for t in self.tables}) as given, \
                torch.enable_grad():
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


class ModuleInit(PartInit):
    """A ``TorchModel``'s initial values by part: dense parameters from ``initial`` (by name), the
    tables' from ``tables`` (``TableInit``: from (seed, table, id), or a config's ``init_fn`` filling
    the rows asked for, as it fills a shard's rows under ``start_hybrid``)."""

    def __init__(self, initial: Mapping[str, np.ndarray], tables: TableInit, specs: Sequence[ParamSpec]):
        self.initial, self.tables = initial, tables
        self.table_of = {spec.name: k for k, spec in enumerate(tables.specs)}
        super().__init__(specs, self._elements)

    def rows(self, table: int, ids: np.ndarray) -> np.ndarray:
        return self.tables.rows(self.table_of[self.specs[table].name], ids)

    def _elements(self, table: int, flat: np.ndarray) -> np.ndarray:
        name = self.specs[table].name
        if name in self.initial:
            return self.initial[name].reshape(-1)[flat]
        return self.tables.elements(self.table_of[name], flat)


def _numpy_grad(tensor: torch.Tensor) -> np.ndarray:
    """``tensor``'s gradient as a numpy array (zeros when nothing reached it)."""
    grad = tensor.grad
    if grad is None:
        return np.zeros(tuple(tensor.shape), DENSE_DTYPES[tensor.dtype])
    return grad.detach().cpu().numpy()


def _module_problems(dense: Mapping[str, torch.nn.Parameter], collections: List[EmbeddingBagCollection]) -> List[str]:
    """What keeps a module from being a ``Model``."""
    problems = [f"dense parameter {key!r} is {param.dtype}; hpcreduce trains float32 or float64"
                for key, param in dense.items() if param.dtype not in DENSE_DTYPES]
    if len(collections) != 1:
        problems.append(f"the module holds {len(collections)} EmbeddingBagCollections (exactly one: every table in it)")
        return problems
    configs = collections[0].embedding_bag_configs()
    clashing = sorted({config.name for config in configs} & set(dense))
    if clashing:
        problems.append(f"tables {clashing} are named like dense parameters; rename the tables")
    problems += [p for p in (init_fn_problem(config) for config in configs) if p]
    return problems
