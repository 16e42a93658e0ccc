"""A TorchModel whose features_of misreports the ids, under the hybrid trainer (1 server, 3 workers):
every rank raises PSTrainingError naming the problem, none hangs.

1. features_of names too few ids (field 0's for both): the collection's forward finds ids not given;
2. features_of leaves a feature out: ``rows`` says which.
"""
import sys
import time

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.ps import PSTrainingError
from hpcreduce.train import ArrayDataset, Hybrid, TrainConfig, train

ctx = hpcreduce.init()
assert ctx.size == 4, "run with 4 ranks"
torch.set_num_threads(1)


def features(columns, keys=("f0", "f1")):
    """One id a bag per key, from the given columns of ids."""
    return hpt.KeyedJaggedTensor(list(keys), torch.cat([torch.from_numpy(c) for c in columns]),
                                 lengths=torch.ones(sum(len(c) for c in columns), dtype=torch.int64))


class TwoFields(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sparse = hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(None, 2, name=f"t{f}", feature_names=[f"f{f}"])
                                                  for f in range(2)])
        self.head = torch.nn.Linear(2, 1)

    def forward(self, ids):
        pooled = self.sparse(features([ids[:, 0], ids[:, 1]])).to_dict()
        return self.head(pooled["f0"] * pooled["f1"]).squeeze(1)


def loss_fn(module, batch):
    logits = module(batch["ids"])
    labels = torch.from_numpy(batch["label"])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    return loss, 0, len(labels)


rng = np.random.default_rng(0)
split = {"ids": rng.integers(0, 50, (600, 2)), "label": rng.integers(0, 2, 600).astype(np.float32)}
data = ArrayDataset("pairs", split, split)
config = TrainConfig(steps=5, batch=60, progress="none", topology=Hybrid(servers=1))
started = time.perf_counter()
for features_of, expected in [(lambda batch: features([batch["ids"][:, 0], batch["ids"][:, 0]]),
                               "are not among the rows given"),
                              (lambda batch: features([batch["ids"][:, 0]], keys=("f0",)),
                               "the batch has no features ['f1']")]:
    torch.manual_seed(0)
    try:
        train(hpt.TorchModel(TwoFields(), loss_fn, features_of), data, config, comm=ctx, verbose=False)
    except PSTrainingError as err:
        assert expected in str(err), err
    else:
        sys.exit(f"rank {ctx.rank}: no PSTrainingError (expected {expected!r})")
ctx.comm.Barrier()
if ctx.rank == 0:
    print(f"torch model errors: all checks passed in {time.perf_counter() - started:.1f} s", flush=True)
