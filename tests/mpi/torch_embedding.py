"""hpcreduce.torch's PSEmbeddingBag and start_hybrid on K servers and the other ranks' workers.

1. equivalence: each worker's pooled rows and loss gradient equal a local nn.EmbeddingBag
   holding the same rows (sum with offsets and per-sample weights, mean on 2-D ids, the bag
   called twice in one step); after one BSP step of server SGD with lr=1 the servers' rows
   are old - (sum over workers of the local row gradients) / workers.
2. hybrid: five more steps with a torch optimizer on the dense part; every worker's dense
   parameters are then bit-identical, and the rows moved.
3. bad input, on every rank: an unbound bag, a model without bags, two bags naming one table.
4. a dense part DistributedDataParallel refuses raises on every worker and the servers return.
5. a model of bags alone is not wrapped in DistributedDataParallel and still trains its rows.
Arguments: ``dynamic`` (the bags' tables are dynamic, keyed by any int64 id, here ids past
2**40) or ``fixed`` (tables of 40 rows), then the number of servers (default 1; the rest work).
"""
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import UnsupportedInputError
from hpcreduce.errors import PSInputError
from hpcreduce.ps import Server

ctx = hpcreduce.init()
rank = ctx.rank
failures = []
ROWS, DIM = 40, 4
DYNAMIC = sys.argv[1] == "dynamic"
SERVERS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
ID_BASE = (1 << 40) if DYNAMIC else 0  # far outside any fixed range: only a dynamic table takes these


def check(condition, message):
    if not condition:
        failures.append(f"rank {rank}: {message}")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        rows = None if DYNAMIC else ROWS + ID_BASE
        self.bag = hpt.PSEmbeddingBag("items", DIM, rows, mode="sum")
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, ids, offsets, weights):
        return self.head(self.bag(ids, offsets, weights))


torch.manual_seed(rank)  # different dense weights everywhere: DDP gives every worker the first's
model = Model()
job = hpt.start_hybrid(model, servers=SERVERS, consistency="bsp", optimizer="sgd", lr=1.0)
if isinstance(job, Server):
    job.serve()
else:
    comm, workers = job.comm, job.comm.Get_size()
    rng = np.random.default_rng(10 + comm.Get_rank())
    every_id = np.arange(ROWS) + ID_BASE
    old = job.worker.pull_rows("items", every_id)
    reference = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum")
    mean_reference = torch.nn.EmbeddingBag(ROWS, DIM, mode="mean")
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(old))
        mean_reference.weight = reference.weight

    # 1. two calls in one step: 1-D ids with offsets and weights (sum), then 2-D ids (mean)
    local_ids = torch.from_numpy(rng.integers(0, ROWS // 2, 12))  # repeats, a subset of rows
    ids, offsets = local_ids + ID_BASE, torch.tensor([0, 3, 3, 7])  # an empty bag too
    weights = torch.from_numpy(rng.normal(size=12).astype(np.float32))
    grid = torch.from_numpy(rng.integers(ROWS // 4, ROWS, (3, 5)))
    target = torch.from_numpy(rng.normal(size=(4, DIM)).astype(np.float32))
    job.bags["items"].prefetch(ids)
    pooled = job.bags["items"](ids, offsets, weights)
    expected = reference(local_ids, offsets, weights)
    check(torch.allclose(pooled, expected, atol=1e-6), f"sum pooling differs by {(pooled - expected).abs().max()}")
    bag_mode, job.bags["items"].mode = job.bags["items"].mode, "mean"
    pooled_grid = job.bags["items"](grid + ID_BASE)
    job.bags["items"].mode = bag_mode
    expected_grid = mean_reference(grid)
    check(torch.allclose(pooled_grid, expected_grid, atol=1e-6), "mean pooling of 2-D ids differs")
    ((pooled * target).sum() + pooled_grid.square().sum()).backward()
    ((expected * target).sum() + expected_grid.square().sum()).backward()
    job.clock()
    grads = comm.allgather(reference.weight.grad.numpy())
    new = job.worker.pull_rows("items", every_id)
    want = old - sum(grads) / workers
    check(np.allclose(new, want, atol=1e-6), f"rows after one SGD step differ by {np.abs(new - want).max():.2e}")
    check(not np.allclose(new, old), "the step changed no row")

    # 2. hybrid steps: the dense part stays identical on every worker
    optimizer = torch.optim.SGD(job.module.parameters(), lr=0.1)
    for step in range(5):
        optimizer.zero_grad()
        ids = torch.from_numpy(rng.integers(0, ROWS, 16)) + ID_BASE
        loss = ((job.module(ids, torch.arange(0, 16, 4), None) - 1) ** 2).mean()
        loss.backward()
        job.push()
        optimizer.step()
        job.clock()
    flat = torch.cat([p.detach().reshape(-1) for p in job.module.parameters()]).numpy()
    check(all(np.array_equal(flat, other) for other in comm.allgather(flat)), "dense parameters differ")
    check(not np.allclose(job.worker.pull_rows("items", every_id), new), "the hybrid steps changed no row")
    job.release()
    if comm.Get_rank() == 0 and not failures:
        print(f"PSEmbeddingBag equals nn.EmbeddingBag on {workers} workers; dense parameters identical", flush=True)

# 3. bad input, on every rank
try:
    hpt.PSEmbeddingBag("loose", DIM, ROWS)(torch.tensor([[1, 2]]))
    check(False, "an unbound bag pulled")
except PSInputError as err:
    check("not bound" in str(err), f"unbound bag: {err}")
for what, module in (("no bag", torch.nn.Linear(2, 2)),
                     ("two bags", torch.nn.ModuleList([hpt.PSEmbeddingBag("t", 2, 8), hpt.PSEmbeddingBag("t", 2, 8)]))):
    try:
        hpt.start_hybrid(module)
        check(False, f"start_hybrid took a module with {what}")
    except UnsupportedInputError as err:
        check("PSEmbeddingBag" in str(err), f"{what}: {err}")

# 4. a dense part the wrapper refuses: every worker raises after releasing the servers (no hang)
role = None
try:
    role = hpt.start_hybrid(Model(), servers=SERVERS, compression="bogus")
except UnsupportedInputError as err:
    check("compression" in str(err), f"bogus compression: {err}")
if isinstance(role, Server):
    role.serve()
else:
    check(role is None, "a worker took compression='bogus'")

# 5. a model of bags alone (matrix factorisation) is not wrapped; its rows still train
users, items = hpt.PSEmbeddingBag("users", DIM, ROWS), hpt.PSEmbeddingBag("items", DIM, ROWS)
job = hpt.start_hybrid(torch.nn.ModuleList([users, items]), servers=SERVERS, consistency="bsp")
if isinstance(job, Server):
    job.serve()
else:
    check(job.module is not None and not isinstance(job.module, hpt.DistributedDataParallel), "bags alone wrapped")
    pair = torch.tensor([[1], [2]])
    before = job.worker.pull_rows("users", [1, 2])
    (users(pair) * items(pair)).sum().neg().backward()
    job.clock()
    check(not np.allclose(job.worker.pull_rows("users", [1, 2]), before), "bags alone: no row moved")
    job.release()

failures = [f for part in ctx.comm.allgather(failures) for f in part]
if rank == 0:
    print("\n".join(failures) if failures else "torch embedding: all checks passed", flush=True)
sys.exit(1 if failures else 0)
