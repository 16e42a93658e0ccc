"""Training: models, data, partitioning, and the trainers that combine the layers below.

    from hpcreduce.train import PS, Model, ArrayDataset, TrainConfig, train
    result = train(model, dataset, TrainConfig(topology=PS(servers=2)))   # a TrainResult

``ring/``: ring AllReduce training and its elastic driver; ``ps/``: parameter-server
training over ``hpcreduce.ps`` and its elastic driver; ``sandblaster/``: batch training over
``hpcreduce.sandblaster``. The names below load on first use, so reading the settings'
declarations (``train.config``, as the command line does to build its flags) loads no trainer.
"""
from importlib import import_module

_EXPORTS = {
    "train": "hpcreduce.train.api",
    **{name: "hpcreduce.train.config" for name in ("TrainConfig", "Ring", "PS", "Sandblaster", "TOPOLOGIES")},
    "Dataset": "hpcreduce.train.data", "ArrayDataset": "hpcreduce.train.data",
    "DirDataset": "hpcreduce.train.data_dir",
    **{name: "hpcreduce.train.model" for name in ("Model", "ParamSpec", "SparseRows", "StepOutput")},
    "TrainResult": "hpcreduce.train.results", "FinalMetrics": "hpcreduce.train.results",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hpcreduce.train' has no attribute {name!r}")
