"""Bring your own model: linear regression, trained data-parallel by hpcreduce's ring trainer.

    hpcreduce launch -n 4 -- python examples/linear_regression.py

A model declares its parameters and returns, for a batch, the summed loss and the
summed gradients (written out by hand, in numpy); hpcreduce splits each step's
global batch over the ranks, sums the gradients with ring AllReduce and applies
the optimizer on every rank.
"""
import numpy as np

import hpcreduce
from hpcreduce.train import ArrayDataset, Model, ParamSpec, StepOutput, TrainConfig, train

FEATURES = 16
NOISE = 0.1


class LinearRegression(Model):
    """y ~ x @ w + b, loss: half the summed squared error."""

    name = "linear-regression"

    def param_specs(self):
        return [ParamSpec("w", (FEATURES,)), ParamSpec("b", (1,))]

    def init_params(self, seed):
        return {"w": np.zeros(FEATURES, np.float32), "b": np.zeros(1, np.float32)}

    def loss_and_grads(self, params, batch):
        x, y = batch["x"], batch["y"]
        error = x @ params["w"] + params["b"][0] - y
        return StepOutput(loss_sum=float(0.5 * (error * error).sum()),
                          grads={"w": x.T @ error, "b": error.sum(keepdims=True)},
                          correct=int((np.abs(error) < 2 * NOISE).sum()),  # "accuracy": within 2 sigma
                          count=len(y))


def make_dataset(seed=0, train_examples=20_000, test_examples=2_000):
    """Noisy linear data from known weights (every rank makes the same, from the seed)."""
    rng = np.random.default_rng(seed)
    true_w, true_b = rng.normal(size=FEATURES).astype(np.float32), np.float32(0.5)
    x = rng.normal(size=(train_examples + test_examples, FEATURES)).astype(np.float32)
    y = (x @ true_w + true_b + NOISE * rng.normal(size=len(x))).astype(np.float32)
    split = {"train": slice(0, train_examples), "test": slice(train_examples, None)}
    parts = {name: {"x": x[part], "y": y[part]} for name, part in split.items()}
    return ArrayDataset("noisy-linear", parts["train"], parts["test"]), true_w


if __name__ == "__main__":
    dataset, true_w = make_dataset()
    config = TrainConfig(model="linear-regression", steps=150, batch=256, lr=0.1, optimizer="momentum")
    result = train(LinearRegression(), dataset, config)  # on every rank; rank 0 prints
    error = float(np.abs(result.params["w"] - true_w).max())
    if hpcreduce.init().rank == 0:
        print(f"noise floor of the loss {NOISE ** 2 / 2:.4f}; largest weight error {error:.4f}")
