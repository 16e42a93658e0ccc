"""The built-in models, each with its data set and the settings it trains well with.

``build(name, seed)`` returns ``(model, dataset)``; ``BUILTIN[name].defaults`` are the
``TrainConfig`` fields ``hpcreduce train --model name`` uses when not given (the
``TrainConfig`` defaults are logreg's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Tuple

from ..data import Dataset
from ..model import Model
from .ctr_data import SyntheticCTR
from .logreg import LogisticRegression
from .mlp import MLP, digits_dataset


@dataclass(frozen=True)
class Builtin:
    """A built-in model: how to make it and its data set, and its usual settings."""

    make: Callable[[int], Tuple[Model, Dataset]]
    description: str
    defaults: Dict[str, Any] = field(default_factory=dict)


BUILTIN: Dict[str, Builtin] = {
    "logreg": Builtin(lambda seed: (LogisticRegression(), SyntheticCTR(seed)),
                      "logistic regression, 2**20 hashed sparse features, synthetic clicks"),
    "mlp": Builtin(lambda seed: (MLP(), digits_dataset(seed)),
                   "64-64-10 tanh MLP on scikit-learn's digits",
                   {"steps": 300, "batch": 64, "lr": 0.1, "optimizer": "momentum"}),
}


def build(name: str, seed: int) -> Tuple[Model, Dataset]:
    """The built-in model ``name`` and its data set, generated from ``seed``."""
    try:
        return BUILTIN[name].make(seed)
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(BUILTIN)}") from None


__all__ = ["BUILTIN", "Builtin", "build", "LogisticRegression", "MLP", "SyntheticCTR",
           "digits_dataset"]
