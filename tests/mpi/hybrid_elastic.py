"""A colocated ``start_hybrid`` loop under ``hpcreduce.elastic`` through a real SIGKILL (3 ranks,
``mpirun --with-ft ulfm``).

A DLRM-style model (an ``EmbeddingBagCollection`` of three fixed tables, a dense MLP over the
pooled rows and dense features) trains BSP with SGD for STEPS steps on a global batch of 12
split over the live ranks, twice in one launch: unkilled, then with ranks SIGKILLed:
``between`` steps (right after its commit) world rank 2 at step 2 and world rank 1 at step 4
(the second loss rebuilt from replicas made after the first), ``in-backward`` (the dense
part's reduction under way) world rank 2 at step 3, ``in-push`` (its push posted, not clocked)
world rank 0 (the sync's root, a table's owner) at step 3; ``random``: world rank 2 from a timer
0-6 ms after step 2 begins (``HPCREDUCE_TEST_SEED``), wherever it then is. The survivors recover
in place (``elastic.State(hybrid=job, ...)``): the tables promote the lost owner's shards from
their replicas, the dense model and optimizer go back to the last commit, and the step is redone
over the ranks left. The survivors must end with the unkilled run's tables (every row) and dense
parameters within 1e-5 (the global batch's gradients summed over 3 shares, then over fewer,
round differently: measured 2e-8; pushes left at 1/3 after the recovery miss by 3e-3), and with
the same dense parameters. Also: tracking a dedicated-layout job is refused on every rank (in the
unkilled part).

Through ``TrainPipeline`` (each call of the loop takes the batches from the committed step on):
``pipelined-after-clock``, world rank 2 right after its ``clock()`` at step 2, before its commit
(the pipeline holding batch 3 planned), then world rank 1 in the dense part's backward at step 4
(batch 5 planned); ``pipelined-pulling``, world rank 0 as the pipeline takes batch 4, batch 3's
pull posted. Also: the unkilled pipelined run ends bit for bit where the unpipelined one ends,
the survivors took a batch again (the one planned before the recovery was dropped), a pipeline
given to ``State`` is refused on every rank, and so is a batch bad on one rank
(``refused_bad_batch``). Measured by hand: a pipeline that kept its planned batch across the
recovery ends 6e-2 (after-clock) and 9e-2 (pulling) away; one that pulled the next batch right
after the clock, before the commit (as without fault tolerance), 6e-4 away.

Run: python hybrid_elastic.py table_wise|row_wise between|in-backward|in-push|random|pipelined-after-clock|
pipelined-pulling. Under ``hpcreduce launch --ft`` with a discovery file: ``table_wise|row_wise leave
DISCOVERY_FILE`` (the file asks for 2 ranks: one leaves at the first commit, ``resized``; ``leave-pipelined``
the same through ``TrainPipeline``), ``leave-both
DISCOVERY_FILE`` (it asks for 1: two ring neighbours may not leave together, ``refused_leave``); with 2 ranks,
``table_wise|row_wise grow DISCOVERY_FILE`` (it asks for 3: a rank is spawned at the first commit, ``resized``;
``grow-pipelined`` the same through ``TrainPipeline``); with 3 ranks, ``table_wise|row_wise replace`` (world
rank 1 killed in its push at step 3, a rank spawned in its place: ``resized``).
"""
import os
import random
import signal
import sys
import threading

import numpy as np
import torch
from mpi4py import MPI

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import elastic
from hpcreduce.errors import UnsupportedInputError
from hpcreduce.ps import Server
from shared_checks import abort_job_on_error, expect

abort_job_on_error()
SHARDING, WHERE = sys.argv[1], sys.argv[2]
ctx = hpcreduce.init(ft=True)
assert ctx.size == (2 if WHERE.startswith("grow") else 3) or ctx.joined, "run with 3 ranks (2 to grow)"
WORLD = MPI.COMM_WORLD.Get_rank()
STEPS, BATCH, DIM = 6, 12, 4
KILLS = {"between": {2: 2, 4: 1}, "in-backward": {3: 2}, "in-push": {3: 0}, "random": {2: 2},
         "pipelined-after-clock": {2: 2, 4: 1}, "pipelined-pulling": {3: 0}, "replace": {3: 1}}.get(WHERE, {})
# step: world rank (``random``: the rank dies at step 2 or later, ``random_kill``)
HOW = {"pipelined-after-clock": {4: "in-backward"}, "replace": {3: "in-push"}}.get(WHERE, {})  # step: where, when not WHERE's own
TABLES = [("users", 40), ("items", 30), ("ads", 20)]
torch.set_num_threads(1)


class Batch:
    def __init__(self, dense, sparse_features, labels):
        self.dense, self.sparse_features, self.labels = dense, sparse_features, labels


class DLRM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sparse = hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(rows, DIM, name=name, feature_names=[name])
                                                  for name, rows in TABLES])
        self.bottom = torch.nn.Linear(3, DIM)
        self.top = torch.nn.Sequential(torch.nn.Linear(4 * DIM, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, batch):
        pooled = self.sparse(batch.sparse_features).values()
        logits = self.top(torch.cat([pooled, self.bottom(batch.dense)], 1)).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels), logits


def batch_of(step: int) -> Batch:
    """This rank's share of step ``step``'s global batch (examples rank, rank + size, ...)."""
    rng = np.random.default_rng([step, 7])
    lengths = rng.integers(1, 3, (len(TABLES), BATCH))
    ids = [rng.integers(0, rows, lengths[t].sum()) for t, (_, rows) in enumerate(TABLES)]
    dense = rng.normal(size=(BATCH, 3)).astype(np.float32)
    labels = rng.integers(0, 2, BATCH).astype(np.float32)
    mine = np.arange(ctx.rank, BATCH, ctx.size)
    starts = [np.concatenate([[0], np.cumsum(lengths[t])]) for t in range(len(TABLES))]
    values = np.concatenate([np.concatenate([ids[t][starts[t][e]:starts[t][e + 1]] for e in mine])
                             for t in range(len(TABLES))])
    return Batch(torch.from_numpy(dense[mine]),
                 hpt.KeyedJaggedTensor([name for name, _ in TABLES], torch.from_numpy(values.astype(np.int64)),
                                       lengths=torch.from_numpy(lengths[:, mine].reshape(-1))),
                 torch.from_numpy(labels[mine]))


def start():
    torch.manual_seed(5)
    return hpt.start_hybrid(DLRM(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=0.5), layout="colocated",
                            sharding=SHARDING, seed=3)


def dies_at(step: int, kill: bool):
    """Where this rank dies at ``step`` of the killed run (None: it does not)."""
    if not kill or KILLS.get(step) != WORLD:
        return None
    return HOW.get(step, WHERE.replace("pipelined-", ""))


def die_in_backward(job) -> None:
    """A SIGKILL in the dense part's backward, its reduction under way."""
    job.module.module.bottom.weight.register_hook(lambda grad: os.kill(os.getpid(), signal.SIGKILL))


def die_after_clock(job) -> None:
    """A SIGKILL right after this step's ``clock()`` returns (inside ``progress``), before the commit."""
    clock = job.clock
    job.clock = lambda: (clock(), os.kill(os.getpid(), signal.SIGKILL))


def train(kill: bool, pipelined: bool):
    job = start()
    dense_opt = torch.optim.SGD(job.module.parameters(), lr=0.5)
    taken = []
    loop = pipelined_loop(job, dense_opt, kill, taken) if pipelined else plain_loop(job, dense_opt, kill)
    state = elastic.State(hybrid=job, model=job.module, optimizer=dense_opt, step=0)
    first = every_row(job)
    loop(state)
    dense = {name: p.detach().clone() for name, p in job.module.named_parameters()}
    job.recovered_s, job.taken = [event["recovered_s"] for event in state.events], taken
    return job, first, every_row(job), dense


def plain_loop(job, dense_opt, kill: bool):
    """The unpipelined steps: ``loss.backward(); job.push(); dense_opt.step(); job.clock()``."""

    @elastic.run
    def loop(state):
        while state.step < STEPS:
            where = dies_at(state.step, kill)
            if kill and WHERE == "random" and WORLD == 2 and state.step in (2, 5):
                random_kill(state.step)
            dense_opt.zero_grad()
            loss, _ = job.module(batch_of(state.step))
            if where == "in-backward":
                die_in_backward(job)
            loss.backward()
            job.push()
            if where == "in-push":
                os.kill(os.getpid(), signal.SIGKILL)
            dense_opt.step()
            job.clock()
            state.step += 1
            state.commit()
            if where == "between":
                os.kill(os.getpid(), signal.SIGKILL)
    return loop


def pipelined_loop(job, dense_opt, kill: bool, taken: list):
    """``TrainPipeline``'s steps; each call of the loop takes the batches from the committed step
    on (``taken``: the steps whose batch was taken, in order). A pipeline in a ``State`` is refused."""
    pipeline = hpt.TrainPipeline(job, dense_opt)
    expect(UnsupportedInputError, "TrainPipeline holds nothing to commit",
           lambda: elastic.State(hybrid=job, pipeline=pipeline, step=0))

    def batches(first: int):
        for step in range(first, STEPS):
            if dies_at(step - 1, kill) == "pulling":  # taking batch step, step - 1's pull posted
                os.kill(os.getpid(), signal.SIGKILL)
            taken.append(step)
            yield batch_of(step)

    @elastic.run
    def loop(state):
        steps = batches(state.step)
        while state.step < STEPS:
            where = dies_at(state.step, kill)
            if where == "in-backward":
                die_in_backward(job)
            if where == "after-clock":
                die_after_clock(job)
            pipeline.progress(steps)
            state.step += 1
            state.commit()  # right after progress(), which ends with clock()
    return loop


def random_kill(step: int) -> None:
    """``random``: a SIGKILL from a timer 0-6 ms after step 2 begins (wherever the step is then:
    a pool, a reduction, a push, an agreement), or at step 5 at the latest."""
    if step == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    delay = random.Random(int(os.environ.get("HPCREDUCE_TEST_SEED", "0"))).random() * 0.006
    threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()


def every_row(job):
    return job.store.pull_rows_many_async({name: np.arange(rows) for name, rows in TABLES}).wait()


def refused_dedicated():
    """Tracking a dedicated-layout job (a server on rank 0, trainers elsewhere) is refused on every rank."""
    torch.manual_seed(5)
    role = hpt.start_hybrid(DLRM(), sparse_optimizer=hpt.RowOptimizer("sgd", lr=0.5), layout="dedicated", servers=1)
    expect(UnsupportedInputError, "dedicated", lambda: elastic.State(hybrid=role, step=0))
    if isinstance(role, Server):
        role.serve()
    else:
        role.release()


def refused_bad_batch():
    """Pipelined under ``elastic.run``, a batch bad on one rank (world rank 1's at step 1: an id
    outside its table) raises on every rank, at the start of its step, nothing of it sent."""
    job = start()
    dense_opt = torch.optim.SGD(job.module.parameters(), lr=0.5)
    pipeline = hpt.TrainPipeline(job, dense_opt)
    state = elastic.State(hybrid=job, model=job.module, optimizer=dense_opt, step=0)

    def batches(first: int):
        for step in range(first, STEPS):
            batch = batch_of(step)
            if step == 1 and WORLD == 1:
                batch.sparse_features.values()[0] = 99
            yield batch

    @elastic.run
    def loop(state):
        steps = batches(state.step)
        while state.step < STEPS:
            pipeline.progress(steps)
            state.step += 1
            state.commit()

    expect(UnsupportedInputError, "looks up ids [99]", lambda: loop(state))
    assert state.step == 1 and job.store.clock_value == 1, (state.step, job.store.clock_value)
    job.store.release()


def resized(discovery: str, pipelined: bool, grows: bool, replaces: bool = False):
    """At the first commit the discovery file changes the ranks: a leave (it asks for 2 of 3: one
    rank exits 0, its shards handed over from their replicas) or, ``grows``, a growth (it asks for
    3 of 2: a rank is spawned, the tables made anew over the 3 and filled from the 2); or,
    ``replaces`` (no file), world rank 1 is SIGKILLed with its step-3 push posted and a rank is
    spawned in its place (``Policy(replace=True)``: the 2 survivors recover the tables, then the
    3 grow them). The ranks there are then end on the run without the change (the newcomer gets
    it from rank 0) within 1e-5, with the same dense parameters, every rank holding rows
    (``pipelined``: through ``TrainPipeline``, which drops the batch it planned over the ranks of
    before)."""
    want = None
    if not ctx.joined:
        reference, _, want_rows, want_dense = train(kill=False, pipelined=False)
        reference.store.release()
        want = (want_rows, want_dense)
    job = start()
    dense_opt = torch.optim.SGD(job.module.parameters(), lr=0.5)
    change = {"policy": elastic.Policy(replace=True)} if replaces else {"discover": discovery}
    state = elastic.State(hybrid=job, model=job.module, optimizer=dense_opt, step=0, **change)
    taken = []
    (pipelined_loop(job, dense_opt, False, taken) if pipelined else plain_loop(job, dense_opt, replaces))(state)
    want_rows, want_dense = ctx.comm.bcast(want, root=0)
    rows = every_row(job)
    dense = {name: p.detach().clone() for name, p in job.module.named_parameters()}
    assert ctx.size == job.store.worker_count == (3 if grows or replaces else 2), (ctx.size, job.store.worker_count)
    gaps = [float(np.abs(rows[name] - want_rows[name]).max()) for name in want_rows] + \
        [float((dense[name] - want_dense[name]).abs().max()) for name in want_dense]
    assert max(gaps) < 1e-5, gaps
    theirs = ctx.comm.allgather(torch.cat([p.reshape(-1) for p in dense.values()]).numpy())
    assert all(np.array_equal(theirs[0], other) for other in theirs), "the ranks' dense parameters differ"
    held = ctx.comm.allgather(rows_held(job))
    assert min(held) > 0, held
    # batch 1, planned over the ranks of before, taken again (a newcomer starts at batch 1)
    assert not pipelined or taken == ([1, 2, 3, 4, 5] if ctx.joined else [0, 1, 1, 2, 3, 4, 5]), taken
    print(f"hybrid elastic {SHARDING} {WHERE}: rank {ctx.rank} of {ctx.size}{' (spawned)' if ctx.joined else ''} "
          f"ends on the run without {'growth' if grows else 'the kill' if replaces else 'a leave'} (largest gap {max(gaps):.1e}; "
          f"rows held {held})", flush=True)
    job.store.release()


def rows_held(job) -> int:
    """The rows this rank's tables hold (table-wise: its whole tables; row-wise: its shard's)."""
    store = job.store
    if SHARDING == "table_wise":
        return sum(len(store.values[t]) for t in store.mine)
    return sum(len(store.store.export(t)[0]) for t in range(len(TABLES)))


def refused_leave(discovery: str):
    """The discovery file asks for 1 rank: ranks 1 and 2 would leave together, and rank 1's shards
    have their only replica on rank 2: every rank raises the same error before anything moves."""
    job = start()
    dense_opt = torch.optim.SGD(job.module.parameters(), lr=0.5)
    state = elastic.State(hybrid=job, model=job.module, optimizer=dense_opt, step=0, discover=discovery)
    said = expect(UnsupportedInputError, "shard keys [1] cannot leave", lambda: plain_loop(job, dense_opt, False)(state))
    print(f"hybrid elastic {SHARDING} leave refused: rank {ctx.rank} of {ctx.size}" + (f": {said}" if ctx.rank == 0
                                                                                      else ""), flush=True)


if WHERE in ("leave", "leave-pipelined", "grow", "grow-pipelined", "replace"):
    resized(sys.argv[3] if len(sys.argv) > 3 else "", pipelined=WHERE.endswith("-pipelined"),
            grows=WHERE.startswith("grow"), replaces=WHERE == "replace")
    sys.exit(0)
if WHERE == "leave-both":
    refused_leave(sys.argv[3])
    sys.exit(0)
refused_dedicated()
PIPELINED = WHERE.startswith("pipelined-")
reference, first_rows, want_rows, want_dense = train(kill=False, pipelined=False)
assert reference.recoveries == []
reference.store.release()
if PIPELINED:  # the unkilled pipelined run: bit for bit the unpipelined one
    refused_bad_batch()
    unkilled, _, piped_rows, piped_dense = train(kill=False, pipelined=True)
    assert all(np.array_equal(piped_rows[name], want_rows[name]) for name in want_rows)
    assert all(torch.equal(piped_dense[name], want_dense[name]) for name in want_dense)
    assert unkilled.taken == list(range(STEPS)), unkilled.taken
    unkilled.store.release()
job, _, rows, dense = train(kill=True, pipelined=PIPELINED)
lost = [[KILLS[step]] for step in sorted(KILLS)]
assert job.store.worker_count == 3 - len(lost) and job.recoveries == lost, (job.store.worker_count, job.recoveries)
if PIPELINED:  # a batch planned before a recovery was dropped and taken again from the committed step
    assert sorted(set(job.taken)) == list(range(STEPS)) and len(job.taken) > STEPS, job.taken
gaps = [float(np.abs(rows[name] - want_rows[name]).max()) for name in want_rows] + \
    [float((dense[name] - want_dense[name]).abs().max()) for name in want_dense]
assert max(gaps) < 1e-5, gaps
assert min(float(np.abs(want_rows[name] - first_rows[name]).max()) for name in want_rows) > 1e-3  # they trained
theirs = ctx.comm.allgather(torch.cat([p.reshape(-1) for p in dense.values()]).numpy())
assert all(np.array_equal(theirs[0], other) for other in theirs), "survivors' dense parameters differ"
print(f"hybrid elastic {SHARDING} {WHERE}: rank {ctx.rank} ends on the unkilled run's tables and dense "
      f"parameters (largest gap {max(gaps):.1e}; recovered in {job.recovered_s} s)", flush=True)
job.store.release()
