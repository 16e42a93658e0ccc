"""Update rules: optimizers, elementwise and in place, run by the servers on their shards.

Each optimizer updates a parameter array and its state arrays (same shape, named by
``state_names``) from a gradient. Being elementwise, the same code updates a whole
tensor, a server's range of it, or rows gathered from a sparse table (the caller
gathers and scatters back), so a ring trainer that holds whole tensors and the
parameter server compute the same update.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple, Type

import numpy as np

from ..arrays import array_module
from .kernels import kernel

FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # updated by a compiled kernel
CHUNK = 1 << 16  # elements: a larger host array is updated by the kernel, or this many at a time (best of 8K-64K)
MIXED = np.dtype(np.void)  # arrays of several dtypes: the numpy rule, by chunks
ONE_ROW = np.zeros(1, dtype=np.int64)  # a whole array updated as row 0 of itself seen as one row

State = Dict[str, object]


class Optimizer:
    """``update(param, grad, state, step)``: one update in place; ``step`` counts from 1. A
    subclass gives the elementwise rule (``_rule``)."""

    name = "optimizer"
    state_names: Tuple[str, ...] = ()

    def __init__(self, lr: float):
        if not lr > 0:
            raise ValueError(f"learning rate must be positive, got {lr}")
        self.lr = lr

    def init_state(self, param) -> State:
        """Zeroed state arrays shaped like ``param``."""
        xp = array_module(param)
        return {name: xp.zeros_like(param) for name in self.state_names}

    def update(self, param, grad, state: State, step: int) -> None:
        """One update of ``param`` and ``state`` in place. Host arrays above ``CHUNK`` elements,
        C-contiguous: float32/float64 ones of one dtype go through the compiled row kernel as one
        row (``_fused``: one pass, no temporaries; 1.8-4.2x faster than numpy's rule from 256K
        elements, ``bench/optimizers.py``), others ``CHUNK`` elements at a time, so that the
        rule's temporaries stay in cache. Smaller arrays take the rule whole (as fast there, and a
        process with small tensors only never loads numba). The same bits every way (the rule is
        elementwise; the kernels compute it in the array's dtype)."""
        layout = _host_layout(param, grad, state) if param.size > CHUNK else None
        if layout is None:
            self._rule(param, grad, state, step)
        elif layout in FUSED_DTYPES:
            self._fused(param.reshape(1, -1), {name: array.reshape(1, -1) for name, array in state.items()},
                        ONE_ROW, grad.reshape(1, -1), step, layout.type)
        else:
            flat, flat_grad = param.reshape(-1), grad.reshape(-1)
            flat_state = {name: array.reshape(-1) for name, array in state.items()}
            for begin in range(0, flat.size, CHUNK):
                end = begin + CHUNK
                self._rule(flat[begin:end], flat_grad[begin:end],
                           {name: array[begin:end] for name, array in flat_state.items()}, step)

    def _rule(self, param, grad, state: State, step: int) -> None:
        """The update rule on whole arrays, elementwise."""
        raise NotImplementedError

    def update_rows(self, values: np.ndarray, state: State, local: np.ndarray, grads: np.ndarray,
                    step: int) -> None:
        """``update`` on the rows at ``local`` (unique) of 2-d ``values`` and ``state`` (rows x
        width), in place: fused into one compiled pass for float32/float64 tables (``_fused``),
        else gathered, updated and scattered back. Bit for bit the same either way."""
        if values.dtype in FUSED_DTYPES and grads.dtype == values.dtype:
            local = np.asarray(local, dtype=np.int64)
            grads = np.require(grads, requirements="CA")
            self._fused(values, state, local, grads, step, values.dtype.type)
            return
        rows = values[local]
        gathered = {name: array[local] for name, array in state.items()}
        self.update(rows, grads, gathered, step)
        values[local] = rows
        for name, array in gathered.items():
            state[name][local] = array

    def _fused(self, values, state, local, grads, step, scalar) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """p -= lr * g"""

    name = "sgd"

    def _rule(self, param, grad, state, step):
        param -= self.lr * grad

    def _fused(self, values, state, local, grads, step, scalar):
        SGD_ROWS(values, local, grads, scalar(self.lr))


class Momentum(Optimizer):
    """v = mu * v + g;  p -= lr * v   (heavy ball, as torch.optim.SGD with momentum)"""

    name = "momentum"
    state_names = ("velocity",)

    def __init__(self, lr: float, momentum: float = 0.9):
        super().__init__(lr)
        self.momentum = momentum

    def _rule(self, param, grad, state, step):
        velocity = state["velocity"]
        velocity *= self.momentum
        velocity += grad
        param -= self.lr * velocity

    def _fused(self, values, state, local, grads, step, scalar):
        MOMENTUM_ROWS(values, state["velocity"], local, grads, scalar(self.lr), scalar(self.momentum))


class Adagrad(Optimizer):
    """a += g^2;  p -= lr * g / (sqrt(a) + eps)   (Downpour SGD's choice on the shards)"""

    name = "adagrad"
    state_names = ("accumulator",)

    def __init__(self, lr: float, eps: float = 1e-8):
        super().__init__(lr)
        self.eps = eps

    def _rule(self, param, grad, state, step):
        xp = array_module(param)
        accumulator = state["accumulator"]
        accumulator += grad * grad
        param -= self.lr * grad / (xp.sqrt(accumulator) + self.eps)

    def _fused(self, values, state, local, grads, step, scalar):
        ADAGRAD_ROWS(values, state["accumulator"], local, grads, scalar(self.lr), scalar(self.eps))


class Adam(Optimizer):
    """m, v: moving averages of g and g^2;  p -= lr * m_hat / (sqrt(v_hat) + eps)"""

    name = "adam"
    state_names = ("m", "v")

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        super().__init__(lr)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def _rule(self, param, grad, state, step):
        xp = array_module(param)
        m, v = state["m"], state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * grad
        v *= self.beta2
        v += (1 - self.beta2) * grad * grad
        m_hat = m / (1 - self.beta1 ** step)
        v_hat = v / (1 - self.beta2 ** step)
        param -= self.lr * m_hat / (xp.sqrt(v_hat) + self.eps)

    def _fused(self, values, state, local, grads, step, scalar):
        ADAM_ROWS(values, state["m"], state["v"], local, grads, scalar(self.lr), scalar(self.beta1),
                  scalar(self.beta2), scalar(1 - self.beta1), scalar(1 - self.beta2),
                  scalar(1 - self.beta1 ** step), scalar(1 - self.beta2 ** step), scalar(self.eps))


def _host_layout(param, grad, state: State) -> Optional[np.dtype]:
    """When ``param``, ``grad`` and the state arrays are C-contiguous host arrays of one shape
    (flat views of them all exist): their dtype if they share one, else ``MIXED``; None otherwise."""
    if not isinstance(param, np.ndarray) or not param.flags.c_contiguous:
        return None
    shape, dtype = param.shape, param.dtype
    for array in (grad, *state.values()):
        if not isinstance(array, np.ndarray) or array.shape != shape or not array.flags.c_contiguous:
            return None
        if array.dtype != dtype:
            dtype = MIXED
    return dtype


SGD_ROWS, MOMENTUM_ROWS = kernel("rows", "sgd"), kernel("rows", "momentum")
ADAGRAD_ROWS, ADAM_ROWS = kernel("rows", "adagrad"), kernel("rows", "adam")
OPTIMIZERS: Dict[str, Type[Optimizer]] = {cls.name: cls for cls in (SGD, Momentum, Adagrad, Adam)}


def make_optimizer(name: str, lr: float) -> Optimizer:
    """The optimizer called ``name`` (sgd, momentum, adagrad, adam) with learning rate ``lr``."""
    try:
        return OPTIMIZERS[name](lr)
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}") from None
