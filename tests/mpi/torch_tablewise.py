"""Colocated table-wise sharding (``start_hybrid(..., sharding="table_wise")``) under real mpirun.

1. against row-wise: three BSP steps (SUM pooling, one table read by two features, one fused
   lookup on the row-wise side; then per-sample weights) end bit for bit where the row-wise
   colocated run ends, tables and dense parameters; MEAN pooling within 1e-6.
2. pipeline: TrainPipeline's BSP steps end bit for bit where the unpipelined steps end.
3. tables saved table-wise (``save_tables``) load on 1 server and 1 trainer, the same rows.
4. bad input raises on every rank before anything moves: a feature naming no table (one rank
   only), lengths that do not add up, ids outside a fixed table, no sparse_features, NaN pooled
   gradients (one rank), a dynamic table, table_wise with the dedicated layout; a good batch still goes.
5. the store: an id outside its table (one rank) refused by pool_async on every rank; tables with
   Adagrad state saved at 2 ranks load at 1 rank, rows and state equal; a checkpoint of other
   tables is refused on every rank.
With the argument ``ft`` (a fault-tolerant launch, replicas on): table-wise keeps replicas and ends
bit for bit where row-wise ends.
"""
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from mpi4py import MPI

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.errors import HpcreduceError
from hpcreduce.ps import ParamSpec, Server
from hpcreduce.ps.colocated.tablewise import TableWiseTables

FT = sys.argv[1:] == ["ft"]
ctx = hpcreduce.init(ft=FT)
rank = ctx.rank
ROWS, DIM, BATCH = 50, 4, 6
failures = []
torch.set_num_threads(1)


def check(condition, message):
    if not condition:
        failures.append(f"rank {rank}: {message}")


@dataclass
class Batch:
    dense: torch.Tensor
    sparse_features: hpt.KeyedJaggedTensor
    labels: torch.Tensor


class Model(torch.nn.Module):
    def __init__(self, pooling="sum", weighted=False, users=ROWS):
        super().__init__()
        self.sparse = hpt.EmbeddingBagCollection(
            [hpt.EmbeddingBagConfig(ROWS, DIM, name="shared", feature_names=["a", "b"]),
             hpt.EmbeddingBagConfig(users, DIM, name="users", feature_names=["u"], pooling=pooling)],
            is_weighted=weighted)
        self.head = torch.nn.Linear(3 * DIM + 3, 1)

    def forward(self, batch):
        pooled = self.sparse(batch.sparse_features).values()
        logits = self.head(torch.cat([pooled, batch.dense], dim=1)).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels), logits


def batch_of(rng, weights=False):
    lengths = torch.from_numpy(rng.integers(0, 4, 3 * BATCH))
    total = int(lengths.sum())
    return Batch(torch.from_numpy(rng.normal(size=(BATCH, 3)).astype(np.float32)),
                 hpt.KeyedJaggedTensor(["a", "b", "u"], torch.from_numpy(rng.integers(0, ROWS, total)),
                                       weights=torch.from_numpy(rng.random(total).astype(np.float32))
                                       if weights else None, lengths=lengths),
                 torch.from_numpy(rng.random(BATCH).astype(np.float32)))


def start(sharding, model=None, **options):
    return hpt.start_hybrid(model or Model(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=0.5),
                            layout=options.pop("layout", "colocated"), consistency=options.pop("consistency", "bsp"),
                            sharding=sharding, **options)


def tables(job):
    """Every table's rows, read from their owners."""
    return job.store.pull_rows_many_async({"shared": np.arange(ROWS), "users": np.arange(ROWS)}).wait()


def run(sharding, pooling="sum", weighted=False, pipelined=False, steps=3):
    torch.manual_seed(0)
    job = start(sharding, Model(pooling, weighted))
    rng = np.random.default_rng(20 + job.comm.Get_rank())
    batches = [batch_of(rng, weighted) for _ in range(steps)]
    optimizer = torch.optim.SGD(job.module.parameters(), lr=0.1)
    if pipelined:
        pipeline, iterator = hpt.TrainPipeline(job, optimizer), iter(batches)
        for _ in batches:
            pipeline.progress(iterator)
    else:
        for batch in batches:
            optimizer.zero_grad()
            job.module(batch)[0].backward()
            job.push()
            optimizer.step()
            job.clock()
    dense = torch.cat([p.detach().reshape(-1) for p in job.module.parameters()]).numpy().copy()
    rows = tables(job)
    job.release()
    return dense, rows


def same(one, other, what, tolerance=0.0):
    (dense, rows), (dense2, rows2) = one, other
    close = (lambda a, b: np.array_equal(a, b)) if tolerance == 0 else \
        (lambda a, b: np.allclose(a, b, rtol=0, atol=tolerance))
    check(close(dense, dense2) and all(close(rows[n], rows2[n]) for n in rows),
          f"{what}: the runs end apart (dense by {np.abs(dense - dense2).max():.1e}, rows by "
          f"{max(np.abs(rows[n] - rows2[n]).max() for n in rows):.1e})")


if FT:  # replicas on: the same bits
    same(run("row_wise"), run("table_wise"), "under fault tolerance")
    job = start("table_wise")
    check(bool(job.store.replicas), "table-wise under fault tolerance keeps no replica")
    job.release()
else:
    # 1. against row-wise
    job = start("row_wise")
    initial = tables(job)
    job.release()
    for pooling, weighted, tolerance in [("sum", False, 0.0), ("sum", True, 0.0), ("mean", False, 1e-6)]:
        row_wise = run("row_wise", pooling, weighted)
        table_wise = run("table_wise", pooling, weighted)
        same(row_wise, table_wise, f"{pooling}, weighted {weighted}", tolerance)
        check(not np.allclose(initial["shared"], table_wise[1]["shared"]), "the steps changed no row")
    # 2. pipeline
    same(run("table_wise"), run("table_wise", pipelined=True), "pipelined against plain steps")
    # 3. tables saved table-wise load on 1 server and 1 trainer
    directory = ctx.comm.bcast(tempfile.mkdtemp() if rank == 0 else None)
    job = start("table_wise")
    for batch in [batch_of(np.random.default_rng(40 + rank)) for _ in range(2)]:
        job.module(batch)[0].backward()
        job.clock()
    hpt.save_tables(job, directory)
    saved = tables(job)
    job.release()
    check(not np.array_equal(saved["shared"], initial["shared"]), "the tables saved are the initial ones")
    job = hpt.start_hybrid(Model(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=0.5), servers=1, tables_from=directory)
    if isinstance(job, Server):
        job.serve()
    else:
        loaded = tables(job)
        check(all(np.array_equal(loaded[n], saved[n]) for n in saved), "tables saved table-wise load otherwise")
        job.release()
    # 4. bad input on every rank
    job = start("table_wise")
    good = batch_of(np.random.default_rng(30)).sparse_features
    stray = hpt.KeyedJaggedTensor(["a", "b", "x"], good.values(), lengths=good.lengths())
    short = hpt.KeyedJaggedTensor(["a", "b", "u"], good.values()[:-1], lengths=good.lengths())
    outside = hpt.KeyedJaggedTensor(["a", "b", "u"], good.values().clone(), lengths=good.lengths())
    outside.values()[-1] = ROWS + 5
    before = tables(job)
    for what, features, expected in [("a feature naming no table (one rank)", stray if rank == 0 else good,
                                      "name no table"), ("lengths", short, "lengths add up to"),
                                     ("ids outside", outside, f"the batch looks up ids [{ROWS + 5}]"),
                                     ("no sparse features", None, "no sparse_features")]:
        try:
            job.collection(features)
            check(False, f"{what}: accepted")
        except HpcreduceError as err:
            check(expected in str(err), f"{what}: {err}")
    after = tables(job)
    check(all(np.array_equal(before[n], after[n]) for n in before), "a refused batch changed a table")
    pooled = job.collection(good)
    check(pooled.values().shape == (BATCH, 3 * DIM), "a good batch after the bad ones failed")
    (pooled.values() * (float("nan") if rank == 1 else 1.0)).sum().backward()  # NaN on one rank only
    try:
        job.collection.push().wait()
        check(False, "a push of NaN gradients (one rank) accepted")
    except HpcreduceError as err:
        check("NaN or Inf" in str(err), f"NaN push: {err}")
    job.clock()
    after = tables(job)
    check(all(np.array_equal(before[n], after[n]) for n in before), "a refused push changed a table")
    job.release()
    for what, options, expected in [("a dynamic table", {"model": Model(users=None)}, "fixed tables only"),
                                    ("the dedicated layout", {"layout": "dedicated"}, "table_wise with layout"),
                                    ("SSP colocated", {"consistency": "ssp", "staleness": 1}, "is synchronous")]:
        try:
            start("table_wise", **options)
            check(False, f"{what}: start_hybrid accepted it")
        except HpcreduceError as err:
            check(expected in str(err), f"{what}: {err}")

if not FT:  # 5. a checkpoint (adagrad: rows and state) saved at 2 ranks loads at 1; other tables refused
    specs = [ParamSpec("p", (60, 4), sparse=True), ParamSpec("q", (40, 4), sparse=True)]
    tables_wise = TableWiseTables(specs, optimizer="adagrad", lr=0.1, comm=ctx.comm, seed=3)
    rng = np.random.default_rng(50 + rank)
    for _ in range(2):
        tables_wise.pool_async([(rng.integers(0, spec.shape[0], 12), np.full(6, 2, np.int64), None)
                                for spec in specs]).wait()
        tables_wise.push_pooled_async([rng.normal(size=(6, 4)).astype(np.float32) for _ in specs]).wait()
        tables_wise.clock()
    outside = [(np.array([0, 60 if rank == 1 else 1]), np.array([2], np.int64), None), (np.zeros(0, np.int64),) * 2
               + (None,)]  # an id outside table p, on one rank only
    try:
        tables_wise.pool_async(outside)
        check(False, "pool_async: an id outside its table (one rank) accepted")
    except HpcreduceError as err:
        check("ids outside it" in str(err), f"pool_async outside: {err}")
    directory = ctx.comm.bcast(tempfile.mkdtemp() if rank == 0 else None)
    tables_wise.save_checkpoint(directory)
    held = {name: arrays for part in ctx.comm.allgather(
        {specs[t].name: (tables_wise.values[t].copy(), dict(tables_wise.state[t])) for t in tables_wise.mine})
        for name, arrays in part.items()}
    tables_wise.release()
    alone = ctx.comm.Split(0 if rank == 0 else MPI.UNDEFINED, rank)
    if rank == 0:
        one = TableWiseTables(specs, optimizer="adagrad", lr=0.1, comm=alone, seed=9)  # other rows: all replaced
        one.load_checkpoint(directory)
        check(one.clock_value == 2, f"checkpoint: loaded at step {one.clock_value}")
        for t, spec in enumerate(specs):
            values, state = held[spec.name]
            check(np.array_equal(one.values[t], values) and state.keys() == one.state[t].keys() and
                  all(np.array_equal(one.state[t][n], state[n]) for n in state), f"checkpoint: {spec.name} differs")
        one.release()
    other = TableWiseTables([ParamSpec("p", (61, 4), sparse=True), specs[1]], optimizer="adagrad", lr=0.1,
                            comm=ctx.comm)
    try:
        other.load_checkpoint(directory)
        check(False, "a checkpoint of other tables loaded")
    except HpcreduceError as err:
        check("it holds tables" in str(err), f"checkpoint of other tables: {err}")
    other.release()

failures = [f for part in ctx.comm.allgather(failures) for f in part]
if failures:
    sys.exit("\n".join(failures))
if rank == 0:
    print("table-wise: all checks passed", flush=True)
