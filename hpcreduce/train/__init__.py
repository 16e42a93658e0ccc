"""Training: models, data, partitioning, and the trainers that combine the layers below.

    from hpcreduce.train import Model, ArrayDataset, TrainConfig, train
    result = train(model, dataset, TrainConfig(mode="ps", servers=2))   # a TrainResult

``ring/``: ring AllReduce training and its elastic driver; ``ps/``: parameter-server
training over ``hpcreduce.ps`` and its elastic driver.
"""
from .api import train
from .config import TrainConfig
from .data import ArrayDataset, Dataset
from .model import Model, ParamSpec, SparseRows, StepOutput
from .results import FinalMetrics, TrainResult

__all__ = ["train", "TrainConfig", "TrainResult", "FinalMetrics", "Model", "ParamSpec", "SparseRows",
           "StepOutput", "Dataset", "ArrayDataset"]
