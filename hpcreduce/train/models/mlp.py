"""A one-hidden-layer perceptron with a softmax output, and scikit-learn's digits (an extra:
``pip install 'hpcreduce[digits]'``).

``logits = tanh(x @ w1 + b1) @ w2 + b2``; loss: summed cross-entropy of the softmax.
Batches are ``{"x": float (b, inputs), "label": int (b,)}``.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from ...arrays import array_module
from ...errors import ConfigurationError
from ..data import ArrayDataset
from ..model import Model, Params, ParamSpec, StepOutput

INIT_STREAM = 0x5EED_0003
SPLIT_STREAM = 0x5EED_0004

__all__ = ["MLP", "digits_arrays", "digits_dataset"]


class MLP(Model):
    """Softmax classifier with one tanh hidden layer."""

    name = "mlp"

    def __init__(self, inputs: int = 64, hidden: int = 64, classes: int = 10, dtype: str = "float32"):
        self.inputs, self.hidden, self.classes, self.dtype = inputs, hidden, classes, dtype

    def param_specs(self) -> List[ParamSpec]:
        return [ParamSpec("w1", (self.inputs, self.hidden), self.dtype),
                ParamSpec("b1", (self.hidden,), self.dtype),
                ParamSpec("w2", (self.hidden, self.classes), self.dtype),
                ParamSpec("b2", (self.classes,), self.dtype)]

    def init_params(self, seed: int) -> Dict[str, np.ndarray]:
        """Glorot-uniform weights, zero biases."""
        rng = np.random.default_rng([seed, INIT_STREAM])
        params = {}
        for spec in self.param_specs():
            if len(spec.shape) == 2:
                limit = np.sqrt(6.0 / sum(spec.shape))
                params[spec.name] = rng.uniform(-limit, limit, spec.shape).astype(spec.dtype)
            else:
                params[spec.name] = np.zeros(spec.shape, spec.dtype)
        return params

    def loss_and_grads(self, params: Params, batch) -> StepOutput:
        w1, b1, w2, b2 = (params[name] for name in ("w1", "b1", "w2", "b2"))
        xp = array_module(w1)
        x = xp.asarray(batch["x"]).astype(w1.dtype)
        labels = xp.asarray(batch["label"])
        picked = (xp.arange(len(labels)), labels)
        hidden = xp.tanh(x @ w1 + b1)
        logits = hidden @ w2 + b2
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        loss_sum = float(-log_probs[picked].sum())
        d_logits = xp.exp(log_probs)  # softmax - one_hot: d loss / d logits
        d_logits[picked] -= 1.0
        d_hidden = (d_logits @ w2.T) * (1.0 - hidden * hidden)
        grads = {"w1": x.T @ d_hidden, "b1": d_hidden.sum(axis=0),
                 "w2": hidden.T @ d_logits, "b2": d_logits.sum(axis=0)}
        correct = int((logits.argmax(axis=1) == labels).sum())
        return StepOutput(loss_sum, grads, correct, len(labels))


def digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 8x8 digits (shipped with it, no download): the pixels scaled to
    [0, 1] (float32, one row an image) and the labels (int64). Without scikit-learn,
    ``ConfigurationError`` naming the extra that installs it (raised on every rank that asks)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ConfigurationError(f"the digits data set needs scikit-learn ({err}): "
                                 "pip install 'hpcreduce[digits]'") from None
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def digits_dataset(seed: int = 0, test_fraction: float = 0.2) -> ArrayDataset:
    """``digits_arrays``, split into train and test by a seeded shuffle."""
    x, labels = digits_arrays()
    order = np.random.default_rng([seed, SPLIT_STREAM]).permutation(len(labels))
    test_count = int(round(len(labels) * test_fraction))
    test, train = order[:test_count], order[test_count:]
    return ArrayDataset("digits", {"x": x[train], "label": labels[train]},
                        {"x": x[test], "label": labels[test]})
