"""Training: models, data, partitioning, and the trainers that combine the layers below.

    from hpcreduce.train import PS, Model, ArrayDataset, TrainConfig, train
    result = train(model, dataset, TrainConfig(topology=PS(servers=2)))   # a TrainResult
    result = train(model, dataset, TrainConfig(topology=Hybrid(servers=2)))  # dense parameters on the workers

``ring/``: ring AllReduce training and its elastic driver; ``ps/``: parameter-server
training over ``hpcreduce.ps`` and its elastic driver (also ``--mode hybrid``); ``sandblaster/``: batch training over
``hpcreduce.sandblaster``. The names below load on first use, so reading the settings'
declarations (``train.config``, as the command line does to build its flags) loads no trainer.
"""
from .. import _lazy_exports

_EXPORTS = {
    "train": "hpcreduce.train.api",
    **{name: "hpcreduce.train.config" for name in ("TrainConfig", "Ring", "PS", "Hybrid", "Sandblaster",
                                                          "TOPOLOGIES")},
    "Dataset": "hpcreduce.train.data", "ArrayDataset": "hpcreduce.train.data",
    "DirDataset": "hpcreduce.train.data_dir",
    **{name: "hpcreduce.train.model" for name in ("Model", "ParamSpec", "SparseRows", "StepOutput")},
    "TrainResult": "hpcreduce.train.results", "FinalMetrics": "hpcreduce.train.results",
}

__all__ = list(_EXPORTS)


__getattr__ = _lazy_exports(__name__, _EXPORTS)
