"""TrainPipeline under SSP(1) on 1 server and 2 trainers: the next batch's pull leaves before this
step's backward, so its rows may miss this step's update too. Measured against the unpipelined
run on the same batches: the servers' read staleness (reader's clock - slowest, at most s), the
pipeline's extra step (1), and both runs' mean training loss over the last steps (learning as
well: within 0.02 of each other, and lower than at the start).
"""
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.ps import Server

ctx = hpcreduce.init()
torch.set_num_threads(1)
STEPS, BATCH, ROWS, DIM = 40, 64, 50, 4


class Batch:
    def __init__(self, sparse_features, labels):
        self.sparse_features, self.labels = sparse_features, labels


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sparse = hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(ROWS, DIM, name="t", feature_names=["a"])])
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, batch):
        logits = self.head(self.sparse(batch.sparse_features).values()).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels), logits


def batches(rank):
    rng = np.random.default_rng(rank)
    truth = np.random.default_rng(99).normal(size=ROWS)
    for _ in range(STEPS):
        ids = rng.integers(0, ROWS, (BATCH, 2))
        labels = (rng.random(BATCH) < 1 / (1 + np.exp(-truth[ids].sum(1)))).astype(np.float32)
        yield Batch(hpt.KeyedJaggedTensor(["a"], torch.from_numpy(ids.reshape(-1)),
                                          lengths=torch.full((BATCH,), 2)), torch.from_numpy(labels))


def run(pipelined):
    torch.manual_seed(0)
    job = hpt.start_hybrid(Model(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=0.5), servers=1,
                           consistency="ssp", staleness=1)
    if isinstance(job, Server):
        job.serve()
        return dict(job.state.read_staleness)
    optimizer = torch.optim.SGD(job.module.parameters(), lr=0.1)
    losses = []
    if pipelined:
        pipeline = hpt.TrainPipeline(job, optimizer)
        assert pipeline.extra_staleness == 1
        data = batches(job.comm.Get_rank())
        for batch in batches(job.comm.Get_rank()):
            logits = pipeline.progress(data)
            losses.append(float(torch.nn.functional.binary_cross_entropy_with_logits(logits.detach(), batch.labels)))
    else:
        for batch in batches(job.comm.Get_rank()):
            optimizer.zero_grad()
            loss, _ = job.module(batch)
            loss.backward()
            job.push()
            optimizer.step()
            job.clock()
            losses.append(float(loss.detach()))
    job.release()
    return losses


plain, piped = run(False), run(True)
if ctx.rank > 0:
    first, last = np.mean(plain[:5]), np.mean(plain[-10:])
    piped_last = np.mean(piped[-10:])
    print(f"rank {ctx.rank}: loss {first:.4f} -> unpipelined {last:.4f}, pipelined SSP(1) {piped_last:.4f}",
          flush=True)
    if not (abs(last - piped_last) < 0.02 and piped_last < first - 0.01):
        sys.exit(f"rank {ctx.rank}: the pipelined SSP run learns differently")
else:
    print(f"server read staleness (clocks behind: reads): unpipelined {plain}, pipelined {piped}", flush=True)
ctx.comm.Barrier()
if ctx.rank == 0:
    print("pipeline ssp: all checks passed", flush=True)
