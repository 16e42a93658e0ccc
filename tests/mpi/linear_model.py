"""The README's bring-your-own model (dense parameters), shared by the tests: y ~ x @ w + b."""
import numpy as np

from hpcreduce.train import Model, ParamSpec, StepOutput


class LinearRegression(Model):
    """Half the summed squared error of a linear model with ``features`` weights and a bias."""

    name = "linear-regression"

    def __init__(self, features: int = 16):
        self.features = features

    def param_specs(self):
        return [ParamSpec("w", (self.features,)), ParamSpec("b", (1,))]

    def init_params(self, seed):
        return {"w": np.zeros(self.features, np.float32), "b": np.zeros(1, np.float32)}

    def loss_and_grads(self, params, batch):
        error = batch["x"] @ params["w"] + params["b"][0] - batch["y"]
        return StepOutput(loss_sum=float(0.5 * (error * error).sum()),
                          grads={"w": batch["x"].T @ error, "b": error.sum(keepdims=True)},
                          correct=int((abs(error) < 0.2).sum()), count=len(error))
