"""Training: the model interface, data sets, partitioning, the ring trainer and results.

    from hpcreduce.train import Model, ArrayDataset, TrainConfig, train
"""
from .api import train
from .config import TrainConfig
from .data import ArrayDataset, Dataset
from .model import Model, ParamSpec, SparseRows, StepOutput

__all__ = ["train", "TrainConfig", "Model", "ParamSpec", "SparseRows", "StepOutput",
           "Dataset", "ArrayDataset"]
