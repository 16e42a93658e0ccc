"""Update rules: optimizers, elementwise and in place, run by the servers on their shards.

Each optimizer updates a parameter array and its state arrays (same shape, named by
``state_names``) from a gradient. Being elementwise, the same code updates a whole
tensor, a server's range of it, or rows gathered from a sparse table (the caller
gathers and scatters back), so a ring trainer that holds whole tensors and the
parameter server compute the same update.
"""
from __future__ import annotations

from typing import Dict, Tuple, Type

from ..arrays import array_module

State = Dict[str, object]


class Optimizer:
    """``update(param, grad, state, step)``: one update in place; ``step`` counts from 1."""

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
        raise NotImplementedError


class SGD(Optimizer):
    """p -= lr * g"""

    name = "sgd"

    def update(self, param, grad, state, step):
        param -= self.lr * grad


class Momentum(Optimizer):
    """v = mu * v + g;  p -= lr * v   (heavy ball, as torch.optim.SGD with momentum)"""

    name = "momentum"
    state_names = ("velocity",)

    def __init__(self, lr: float, momentum: float = 0.9):
        super().__init__(lr)
        self.momentum = momentum

    def update(self, param, grad, state, step):
        velocity = state["velocity"]
        velocity *= self.momentum
        velocity += grad
        param -= self.lr * velocity


class Adagrad(Optimizer):
    """a += g^2;  p -= lr * g / (sqrt(a) + eps)   (Downpour SGD's choice on the shards)"""

    name = "adagrad"
    state_names = ("accumulator",)

    def __init__(self, lr: float, eps: float = 1e-8):
        super().__init__(lr)
        self.eps = eps

    def update(self, param, grad, state, step):
        xp = array_module(param)
        accumulator = state["accumulator"]
        accumulator += grad * grad
        param -= self.lr * grad / (xp.sqrt(accumulator) + self.eps)


class Adam(Optimizer):
    """m, v: moving averages of g and g^2;  p -= lr * m_hat / (sqrt(v_hat) + eps)"""

    name = "adam"
    state_names = ("m", "v")

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        super().__init__(lr)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def update(self, param, grad, state, step):
        xp = array_module(param)
        m, v = state["m"], state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * grad
        v *= self.beta2
        v += (1 - self.beta2) * grad * grad
        m_hat = m / (1 - self.beta1 ** step)
        v_hat = v / (1 - self.beta2 ** step)
        param -= self.lr * m_hat / (xp.sqrt(v_hat) + self.eps)


OPTIMIZERS: Dict[str, Type[Optimizer]] = {cls.name: cls for cls in (SGD, Momentum, Adagrad, Adam)}


def make_optimizer(name: str, lr: float) -> Optimizer:
    """The optimizer called ``name`` (sgd, momentum, adagrad, adam) with learning rate ``lr``."""
    try:
        return OPTIMIZERS[name](lr)
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}") from None
