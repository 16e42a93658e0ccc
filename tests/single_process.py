"""A single-process trainer for models with sparse tables, no MPI: each sparse table is a
``RowStore`` (rows by any int64 id, an id without a row reads as its initial value), the
dense parameters are arrays, and one optimizer (``hpcreduce.ps.optimizers``, elementwise)
updates both, as a parameter server would. A reference for what the distributed runs reach."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict

import numpy as np
from threadpoolctl import threadpool_limits  # scikit-learn's dependency, in the test extra

from hpcreduce.ps.optimizers import make_optimizer
from hpcreduce.ps.tables import ParamSpec, initial_rows
from hpcreduce.train.data import Dataset
from hpcreduce.train.model import Model, SparseRows, checked_grads


class RowStore:
    """Rows of one sparse table keyed by int64 id, in sorted arrays (a row and its optimizer
    state are made the first time a gradient arrives for its id)."""

    def __init__(self, spec: ParamSpec, initial: Callable[[np.ndarray], np.ndarray], state_names):
        self.spec, self.initial = spec, initial
        self.ids = np.zeros(0, np.int64)
        self.values = np.zeros((0,) + tuple(spec.shape[1:]), spec.dtype)
        self.state = {name: np.zeros_like(self.values) for name in state_names}

    def pull(self, ids: np.ndarray) -> np.ndarray:
        """Values of ``ids`` (sorted, unique): the stored row, else the initial value."""
        position = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        found = (self.ids[position] == ids) if len(self.ids) else np.zeros(len(ids), bool)
        values = np.empty((len(ids),) + self.values.shape[1:], self.values.dtype)
        values[found] = self.values[position[found]]
        values[~found] = self.initial(ids[~found])
        return values

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Positions of ``ids`` (sorted, unique) among the stored rows, making the missing ones."""
        new = np.setdiff1d(ids, self.ids, assume_unique=True)
        if len(new):
            at = np.searchsorted(self.ids, new)
            self.ids = np.insert(self.ids, at, new)
            self.values = np.insert(self.values, at, self.initial(new), axis=0)
            self.state = {name: np.insert(state, at, 0.0, axis=0) for name, state in self.state.items()}
        return np.searchsorted(self.ids, ids)


@dataclass
class Trained:
    accuracy: float  # on the held-out split
    loss: float  # mean held-out loss
    seconds: float  # training only
    rows: Dict[str, int]  # rows made per sparse table


def initial_of(model: Model, spec: ParamSpec, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """How a row of ``spec`` starts: ``initial_rows`` for a dynamic table, else zeros (logreg's)."""
    if spec.dynamic is not None:
        return lambda ids: initial_rows(spec, ids)
    return lambda ids: np.zeros((len(ids),) + tuple(spec.shape[1:]), spec.dtype)


def train(model: Model, dataset: Dataset, *, steps: int, batch: int, lr: float, optimizer: str = "adagrad",
          seed: int = 0) -> Trained:
    """``steps`` steps of ``batch`` examples (the training split in order, wrapping), gradients
    divided by the batch; then the held-out accuracy and loss. BLAS on one thread, as on an MPI
    rank sharing the cores (its threads only slow these small products down)."""
    with threadpool_limits(1):
        return _train(model, dataset, steps, batch, make_optimizer(optimizer, lr), seed)


def _train(model: Model, dataset: Dataset, steps: int, batch: int, rule, seed: int) -> Trained:
    specs = model.param_specs()
    dense = model.init_params(seed)
    dense_state = {name: rule.init_state(value) for name, value in dense.items()}
    stores = {spec.name: RowStore(spec, initial_of(model, spec, seed), rule.state_names)
              for spec in specs if spec.sparse}
    size = dataset.size("train")
    started = time.perf_counter()
    for step in range(1, steps + 1):
        examples = dataset.batch("train", np.arange((step - 1) * batch, step * batch) % size)
        params = params_for(model, stores, dense, examples)
        grads = checked_grads(model, specs, model.loss_and_grads(params, examples))
        for name, grad in grads.items():
            if isinstance(grad, SparseRows):
                store = stores[name]
                at = store.rows_of(np.asarray(grad.ids))
                values, state = store.values[at], {key: part[at] for key, part in store.state.items()}
                rule.update(values, grad.values / batch, state, step)
                store.values[at] = values
                for key, part in state.items():
                    store.state[key][at] = part
            else:
                rule.update(dense[name], grad / np.asarray(batch, grad.dtype), dense_state[name], step)
    seconds = time.perf_counter() - started
    accuracy, loss = evaluate(model, dataset, stores, dense)
    return Trained(accuracy, loss, seconds, {name: len(store.ids) for name, store in stores.items()})


def params_for(model: Model, stores: Dict[str, RowStore], dense, examples):
    """The model's view for ``examples``: dense arrays and the rows the batch touches."""
    rows = model.rows(examples)
    return {**dense, **{name: SparseRows(rows[name], store.pull(rows[name])) for name, store in stores.items()}}


def evaluate(model: Model, dataset: Dataset, stores: Dict[str, RowStore], dense, chunk: int = 8192):
    """Held-out accuracy and mean loss."""
    count, correct, loss = dataset.size("test"), 0, 0.0
    for start in range(0, count, chunk):
        examples = dataset.batch("test", np.arange(start, min(start + chunk, count)))
        output = model.loss_and_grads(params_for(model, stores, dense, examples), examples)
        correct, loss = correct + output.correct, loss + output.loss_sum
    return correct / count, loss / count
