"""A TorchModel whose table has an ``init_fn``, under the hybrid trainer (2 servers, 2 workers) and the
ring trainer (4 ranks): the tables' rows start as the init_fn fills them (the untouched rows end at its
constant), the other table from (seed, table, id) as without one. Every rank builds the module from its
own torch random state, and every rank still ends with the same dense parameters (rank 0's start).
"""
import sys
import time

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.train import ArrayDataset, Hybrid, Ring, TrainConfig, train

ctx = hpcreduce.init()
assert ctx.size == 4, "run with 4 ranks"
torch.set_num_threads(1)
ROWS, TOUCHED, FILL = 50, 40, 0.25


def features(ids):
    """Feature f0 (table t0, filled by its init_fn) and f1 (table t1, the default init), one id a bag."""
    return hpt.KeyedJaggedTensor(["f0", "f1"], torch.cat([torch.from_numpy(ids[:, 0]), torch.from_numpy(ids[:, 1])]),
                                 lengths=torch.ones(2 * len(ids), dtype=torch.int64))


class TwoTables(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sparse = hpt.EmbeddingBagCollection([
            hpt.EmbeddingBagConfig(ROWS, 2, name="t0", feature_names=["f0"], init_fn=lambda w: w.fill_(FILL)),
            hpt.EmbeddingBagConfig(ROWS, 2, name="t1", feature_names=["f1"])])
        self.head = torch.nn.Linear(2, 1)

    def forward(self, ids):
        pooled = self.sparse(features(ids)).to_dict()
        return self.head(pooled["f0"] * pooled["f1"]).squeeze(1)


def loss_fn(module, batch):
    logits = module(batch["ids"])
    labels = torch.from_numpy(batch["label"])
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum"), 0, len(labels)


rng = np.random.default_rng(0)
split = {"ids": rng.integers(0, TOUCHED, (400, 2)), "label": rng.integers(0, 2, 400).astype(np.float32)}
data = ArrayDataset("pairs", split, split)
started = time.perf_counter()
for topology in (Hybrid(servers=2), Ring()):
    torch.manual_seed(ctx.rank)  # torch's random state differs by rank: the init_fn's constant does not
    model = hpt.TorchModel(TwoTables(), loss_fn, lambda batch: features(batch["ids"]), seed=3)
    result = train(model, data, TrainConfig(steps=4, batch=80, lr=0.5, seed=3, progress="none", topology=topology),
                   comm=ctx, verbose=False)
    t0, t1 = np.asarray(result.params["t0"]), np.asarray(result.params["t1"])
    where = f"rank {ctx.rank}, {type(topology).__name__}"
    if not np.array_equal(t0[TOUCHED:], np.full((ROWS - TOUCHED, 2), FILL, np.float32)):
        sys.exit(f"{where}: the untouched rows of t0 are not the init_fn's {FILL}: {t0[TOUCHED:]}")
    if np.allclose(t0[:TOUCHED], FILL):
        sys.exit(f"{where}: no row of t0 was trained")
    heads = ctx.comm.allgather(np.asarray(result.params["head.weight"]).tobytes())
    if len(set(heads)) != 1:
        sys.exit(f"{where}: the ranks end with different dense parameters (replicas built apart diverged)")
    initial_t1 = model.init_params(3)["t1"]
    if not np.array_equal(t1[TOUCHED:], initial_t1[TOUCHED:]) or np.allclose(initial_t1, FILL):
        sys.exit(f"{where}: t1's untouched rows are not its (seed, table, id) initial values")
ctx.comm.Barrier()
if ctx.rank == 0:
    print(f"torch model init_fn: all checks passed in {time.perf_counter() - started:.1f} s", flush=True)
