"""hpcreduce.torch's EmbeddingBagCollection, start_hybrid and TrainPipeline under real mpirun.

1. equivalence: each trainer's pooled rows equal local nn.EmbeddingBags holding the same rows
   (two features sharing a table; SUM and MEAN, then SUM on both: one fused lookup); after one BSP step of
   server SGD with lr=1 the rows are old - (sum over trainers of the local row gradients) / trainers.
2. pipeline: four BSP steps through TrainPipeline end bit for bit where four unpipelined
   steps end (rows and dense parameters); the dense parameters are identical on every trainer.
3. saved tables: fixed tables saved by the trainers after two steps start a job of another
   number of servers and trainers with the same rows; another table layout is refused.
4. bad input, on every rank, before anything moves (also a pipeline's next batch): a feature naming no table (on one trainer
   only), lengths that do not add up, ids outside a fixed table, a batch without
   sparse_features, tables declared differently on two ranks, an init_fn changing the shape.
Arguments: the layout (``dedicated`` or ``colocated``), the number of servers (dedicated).
"""
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.errors import HpcreduceError
from hpcreduce.ps import Server
from hpcreduce.torch.layouts import TableInit

ctx = hpcreduce.init()
rank = ctx.rank
LAYOUT = sys.argv[1] if len(sys.argv) > 1 else "dedicated"
SERVERS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
ROWS, DIM, BATCH = 40, 4, 6
failures = []
torch.set_num_threads(1)


def check(condition, message):
    if not condition:
        failures.append(f"rank {rank}: {message}")


def configs(init_fn=None, rows=ROWS, users="mean"):
    return [hpt.EmbeddingBagConfig(rows, DIM, name="shared", feature_names=["a", "b"], init_fn=init_fn),
            hpt.EmbeddingBagConfig(None, DIM, name="users", feature_names=["u"], pooling=users,
                                   weight_init_min=-0.5, weight_init_max=0.5)]


@dataclass
class Batch:
    dense: torch.Tensor
    sparse_features: hpt.KeyedJaggedTensor
    labels: torch.Tensor


def batch_of(rng, weights=False):
    lengths = torch.from_numpy(rng.integers(0, 4, 3 * BATCH))
    total = int(lengths.sum())
    ids = rng.integers(0, ROWS, total)
    ids[int(lengths[:2 * BATCH].sum()):] += 1 << 40  # the users table is dynamic: any int64 id
    return Batch(torch.from_numpy(rng.normal(size=(BATCH, 3)).astype(np.float32)),
                 hpt.KeyedJaggedTensor(["a", "b", "u"], torch.from_numpy(ids),
                                       weights=torch.from_numpy(rng.random(total).astype(np.float32))
                                       if weights else None, lengths=lengths),
                 torch.from_numpy(rng.random(BATCH).astype(np.float32)))


class Model(torch.nn.Module):
    def __init__(self, init_fn=None, rows=ROWS, users="mean"):
        super().__init__()
        self.sparse = hpt.EmbeddingBagCollection(configs(init_fn, rows, users))
        self.head = torch.nn.Linear(3 * DIM + 3, 1)

    def forward(self, batch):
        pooled = self.sparse(batch.sparse_features).values()
        logits = self.head(torch.cat([pooled, batch.dense], dim=1)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, logits


def start(model=None, **options):
    torch.manual_seed(rank)  # different dense weights everywhere: DDP gives every trainer the first's
    return hpt.start_hybrid(model or Model(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=1.0), layout=LAYOUT,
                            servers=SERVERS, consistency="bsp", **options)


def rows_of(job, ids_by_table):
    return job.store.pull_rows_many_async(ids_by_table).wait()


def checksum(job, ids_by_table):
    dense = torch.cat([p.detach().reshape(-1) for p in job.module.parameters()]).numpy()
    rows = rows_of(job, ids_by_table)
    return dense, [rows[name] for name in sorted(rows)]


EVERY = {"shared": np.arange(ROWS), "users": np.arange(ROWS) + (1 << 40)}

# 1. equivalence with local nn.EmbeddingBag on the same rows, and one SGD step's update
def equivalence(users_pooling):
    job = start(Model(users=users_pooling))
    if not isinstance(job, Server):
        comm, trainers = job.comm, job.comm.Get_size()
        rng = np.random.default_rng(10 + comm.Get_rank())
        old = rows_of(job, EVERY)
        shared = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(old["shared"]), freeze=False, mode="sum")
        users = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(old["users"]), freeze=False,
                                                      mode=users_pooling)
        batch = batch_of(rng)
        pooled = job.collection(batch.sparse_features).to_dict()
        kjt = batch.sparse_features
        offsets = kjt.offsets()
        local = kjt.values() - torch.where(kjt.values() >= 1 << 40, 1 << 40, 0)
        expected = {}
        for k, (key, bag) in enumerate([("a", shared), ("b", shared), ("u", users)]):
            start_at = int(offsets[k * BATCH])
            bag_offsets = offsets[k * BATCH:(k + 1) * BATCH] - start_at
            expected[key] = bag(local[start_at:int(offsets[(k + 1) * BATCH])], bag_offsets)
        for key in "abu":
            check(torch.allclose(pooled[key], expected[key], atol=1e-6), f"feature {key} pools differently")
        target = torch.from_numpy(rng.normal(size=(BATCH, 3 * DIM)).astype(np.float32))
        (torch.cat([pooled[k] for k in "abu"], 1) * target).sum().backward()
        (torch.cat([expected[k] for k in "abu"], 1) * target).sum().backward()
        job.clock()
        grads = comm.allgather((shared.weight.grad.numpy(), users.weight.grad.numpy()))
        new = rows_of(job, EVERY)
        for t, name in enumerate(("shared", "users")):
            want = old[name] - sum(g[t] for g in grads) / trainers
            check(np.allclose(new[name], want, atol=1e-6), f"{name} after one SGD step differs by "
                                                          f"{np.abs(new[name] - want).max():.2e}")
        check(not np.allclose(new["shared"], old["shared"]), "the step changed no row")
        job.release()
        if comm.Get_rank() == 0 and not failures:
            print(f"EmbeddingBagCollection equals nn.EmbeddingBag on {trainers} trainers ({LAYOUT}, {users_pooling})",
                  flush=True)
    elif LAYOUT == "dedicated":
        job.serve()


equivalence("mean")
equivalence("sum")  # one fused lookup for both tables

# 2. pipelined BSP steps end where unpipelined ones end
def run(pipelined):
    job = start()
    if isinstance(job, Server):
        job.serve()
        return None
    rng = np.random.default_rng(20 + job.comm.Get_rank())
    batches = [batch_of(rng, weights=False) for _ in range(4)]
    optimizer = torch.optim.SGD(job.module.parameters(), lr=0.1)
    if pipelined:
        pipeline = hpt.TrainPipeline(job, optimizer)
        iterator = iter(batches)
        outputs = [pipeline.progress(iterator) for _ in batches]
        try:
            pipeline.progress(iterator)
            check(False, "progress after the last batch did not raise StopIteration")
        except StopIteration:
            pass
        check(len(outputs) == 4 and outputs[0].shape == (BATCH,), "progress returned no outputs")
    else:
        for batch in batches:
            optimizer.zero_grad()
            loss, _ = job.module(batch)
            loss.backward()
            job.push()
            optimizer.step()
            job.clock()
    result = checksum(job, EVERY)
    dense = job.comm.allgather(result[0])
    check(all(np.array_equal(dense[0], d) for d in dense), "dense parameters differ between trainers")
    job.release()
    return result


plain, piped = run(False), run(True)
if plain is not None:
    check(np.array_equal(plain[0], piped[0]) and all(np.array_equal(a, b) for a, b in zip(plain[1], piped[1])),
          "the pipelined BSP run ends elsewhere than the unpipelined one")
    if rank == ctx.size - 1 and not failures:
        print("TrainPipeline under BSP ends bit for bit where the unpipelined steps end", flush=True)

# 3. fixed tables saved sharded, loaded at another number of servers and trainers
class Fixed(torch.nn.Module):
    def __init__(self, rows=ROWS):
        super().__init__()
        self.sparse = hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(rows, DIM, name="shared",
                                                                         feature_names=["a", "b", "u"])])

    def forward(self, batch):
        return self.sparse(batch.sparse_features).values().square().mean(), None


directory = ctx.comm.bcast(tempfile.mkdtemp() if rank == 0 else None)
job = hpt.start_hybrid(Fixed(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=1.0), layout=LAYOUT, servers=SERVERS)
saved = None
if isinstance(job, Server):
    job.serve()
else:
    rng = np.random.default_rng(40 + job.comm.Get_rank())
    for _ in range(2):
        kjt = batch_of(rng).sparse_features
        fixed = hpt.KeyedJaggedTensor(kjt.keys(), kjt.values() % ROWS, lengths=kjt.lengths())
        job.module(Batch(None, fixed, None))[0].backward()
        job.clock()
    hpt.save_tables(job, directory)
    saved = rows_of(job, {"shared": np.arange(ROWS)})["shared"]
    job.release()
saved = [rows for rows in ctx.comm.allgather(saved) if rows is not None][0]
LOAD_SERVERS = 1 if LAYOUT == "colocated" else SERVERS + 1  # colocated: saved by every rank, loaded dedicated
job = hpt.start_hybrid(Fixed(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=1.0), servers=LOAD_SERVERS,
                       tables_from=directory)
if isinstance(job, Server):
    job.serve()
else:
    check(job.comm.Get_size() == ctx.size - LOAD_SERVERS, "the reloaded job has the trainers asked for")
    check(np.array_equal(rows_of(job, {"shared": np.arange(ROWS)})["shared"], saved),
          "the tables loaded at another number of servers differ from the saved ones")
    initial = TableInit(Fixed().sparse.embedding_bag_configs(), 0).rows(0, np.arange(ROWS))
    check(not np.allclose(saved, initial), "the saved tables are the initial ones: the steps trained nothing")
    job.release()
try:
    hpt.start_hybrid(Fixed(rows=ROWS + 1), sparse_optimizer=hpt.RowOptimizer("sgd", lr=1.0), servers=SERVERS,
                     tables_from=directory)
    check(False, "tables saved with another layout were loaded")
except HpcreduceError as err:
    check("are not the collection's" in str(err), f"another layout: {err}")
if rank == 0 and not failures:
    print(f"tables saved by {ctx.size - (0 if LAYOUT == 'colocated' else SERVERS)} trainers load on {LOAD_SERVERS} "
          f"servers", flush=True)

# 4. bad input on every rank
job = start()
if isinstance(job, Server):
    job.serve()
else:
    rng = np.random.default_rng(30)
    good = batch_of(rng)
    kjt = good.sparse_features
    stray = hpt.KeyedJaggedTensor(["a", "b", "x"], kjt.values(), lengths=kjt.lengths())
    short = hpt.KeyedJaggedTensor(["a", "b", "u"], kjt.values()[:-1], lengths=kjt.lengths())
    outside = hpt.KeyedJaggedTensor(["a", "b", "u"], kjt.values().clone(), lengths=kjt.lengths())
    outside.values()[0] = ROWS + 5
    first = job.comm.Get_rank() == 0
    for what, features, expected in [("a feature naming no table (one trainer)", stray if first else kjt, "name no table"),
                                     ("lengths", short, "lengths add up to"),
                                     ("ids outside", outside, f"the batch looks up ids [{ROWS + 5}]"),
                                     ("no sparse features", None, "no sparse_features")]:
        try:
            job.collection(features)
            check(False, f"{what}: accepted")
        except HpcreduceError as err:
            check(expected in str(err), f"{what}: {err}")
    pipeline = hpt.TrainPipeline(job, torch.optim.SGD(job.module.parameters(), lr=0.1))
    try:  # the next batch's check travels during this step; it is refused before its pull leaves
        pipeline.progress(iter([good, Batch(good.dense, stray if first else kjt, good.labels)]))
        check(False, "pipeline: a next batch naming no table (one trainer) accepted")
    except HpcreduceError as err:
        check("name no table" in str(err), f"pipeline: {err}")
    check(pipeline.progress(iter([good])).shape == (BATCH,), "pipeline: no step after a refused batch")
    pooled = job.collection(kjt)  # nothing moved: a good batch still goes
    check(pooled.values().shape == (BATCH, 3 * DIM), "a good batch after the bad ones failed")
    before = rows_of(job, EVERY)
    pooled.to_dict()["a"].sum().backward()  # no gradient reaches the users table: it pushes no rows
    job.clock()
    after = rows_of(job, EVERY)
    check(np.array_equal(before["users"], after["users"]) and not np.array_equal(before["shared"], after["shared"]),
          "a step whose loss reads only the shared table changed the users table, or left the shared one")
    job.release()

for what, model, expected in [("tables declared differently", lambda: Model(rows=ROWS + rank % 2), "tables"),
                              ("init_fn changing the shape", lambda: Model(init_fn=lambda t: t[:1]), "init_fn must fill"),
                              ("two collections", lambda: torch.nn.ModuleList([Model(), Model()]), "exactly one")]:
    try:
        start(model())
        check(False, f"{what}: start_hybrid accepted it")
    except HpcreduceError as err:
        check(expected in str(err), f"{what}: {err}")

failures = ctx.comm.allgather(failures)
failures = [f for rank_failures in failures for f in rank_failures]
if failures:
    sys.exit("\n".join(failures))
if rank == 0:
    print("torch embedding: all checks passed", flush=True)
