"""A colocated ``start_hybrid`` job under ``hpcreduce.elastic``: a SIGKILLed rank survived in
place, ranks leaving and joining at a commit.

    job = hpt.start_hybrid(model, sparse_optimizer=hpt.RowOptimizer("sgd", lr=0.1), layout="colocated")
    dense_opt = torch.optim.SGD(job.module.parameters(), lr=0.1)
    state = elastic.State(hybrid=job, model=job.module, optimizer=dense_opt, step=0)

    @elastic.run
    def train(state):
        while state.step < steps:
            dense_opt.zero_grad()
            loss_fn(job.module(batch(state.step, job.comm))).backward()
            job.push(); dense_opt.step(); job.clock()
            state.step += 1
            state.commit()                 # right after clock(): nothing is redone twice

Pipelined, the same (``TrainPipeline``; the pipeline is not tracked, its job is):

    pipeline = hpt.TrainPipeline(job, dense_opt)

    @elastic.run
    def train(state):
        batches = my_batches(state.step, job.comm)   # again in each call: from the committed step
        while state.step < steps:
            pipeline.progress(batches)               # ends with clock(): the next pull waits
            state.step += 1
            state.commit()

The job counts the calls of the loop that ended (``attempts_ended``), and a pipeline drops,
unwaited, a batch it planned in an earlier call (for the ranks of then, from that call's
iterator); the recovery forgets the collection's pull in flight. Under a fault-tolerant launch a
colocated job ``recovers_in_place``, and the pipeline then posts the next batch's pull at the
start of the next ``progress`` instead of right after the clock, so that no call of the tables
comes between the clock and the commit.

The job is tracked by the ``job`` handler (``elastic.handlers.Own``). Its tables commit each
push by one agreement of their own (``ps.colocated.agreed_calls``), so a commit keeps only the
job's step. After a failure the driver shrinks the context and every survivor restores its
last commit and takes rank 0's (the dense model and optimizer as committed); the job takes rank
0's step and, at its tables' next call, the store recovers on its own communicator
(``recover()``: the lost shards promoted from their replicas on the ring successors,
re-replicated), its clock set back to that step; the collection scales pushes by 1/survivors
and checks batches over them; the DDP wrapper, built over the context, duplicates the new
communicator at its next reduction. Committed right after ``clock()``, the committed step is
the tables' next one on every survivor (their push agreement is uniform and nothing
communicates between it and the commit), so the survivors redo exactly the steps the tables
never applied, with the rows they read the first time: under BSP the run ends where the
unkilled run ends, to the rounding of the global batch's sums over fewer shares
(tests/mpi/hybrid_elastic.py: within 2e-8). Committed less often, the steps redone were applied
by the tables already: each table refuses a step it applied (exactly once), but the redone
dense steps read the later rows (rank 0 says so at the recovery).

Every rank makes the same agreements on the tables' communicator whichever communicator it saw
the failure on: at the end of each call of the loop (``elastic_attempt_ended``) a rank that
left by a failure joins the tables' failure agreement unless a call of theirs already did, and
one that finished joins a closing one; a rank that sees the failure in a call of the tables first
revokes the context's and the DDP wrapper's communicators (``revoke_others``), so that no peer
stays blocked there for it.

A leave (at a commit): every rank, the leaving ones included, has the tables hand the leaving
ranks' shards over (``elastic_before_leave``: the staying ranks take them from their replicas,
``hand_over``); the staying ones then go on over their own communicator
(``elastic_after_leave``), nothing rolled back.

A growth (ranks spawned at a commit, e.g. a discovery file asking for more): a spawned rank runs
the program from the top, and its ``start_hybrid`` makes no collective (its peers are in the
sync): it wraps the dense part in ``DistributedDataParallel`` on its own (the sync then gives it
rank 0's parameters and optimizer) and keeps what makes the tables (``tables_anew``). In the
sync every rank, old and new, makes the tables anew with no row over the larger context (shard
keys: the new ranks; the ranks of before keep their order, so row-wise, with no failure before,
only the newcomers' rows move) and fills them from the tables of before (``grown_from``:
row-wise each row to its owner by rendezvous hashing with its optimizer state and a dynamic
table's use counters, ``moves.placed`` as a checkpoint load does; table-wise each table whole
to its owner, ``tablewise_checkpoint.install`` as a load does), at rank 0's step, each step
applied at most once still, the replicas made anew; the collection then scales pushes and checks
batches over every rank, and this call of the loop ends (a ``TrainPipeline`` drops the batch it
planned over the ranks of before). Under BSP, with each step's data a function of the global
batch, the run ends where the run without growth ends (tests/mpi/hybrid_elastic.py: within
2e-8). A rank failing during the growth itself is not recovered: the job ends at once with one
clear error (``elastic.resizing.grow``), nothing hangs.

A replacement (``Policy(replace=True)``: one rank spawned per rank lost, right after the
survivors shrank) is the recovery, then a growth: in the newcomer's sync the ranks of before
run the tables' recovery among themselves first (``recover_now``, on the tables' own
communicator: the lost shards promoted from their replicas), then every rank grows the tables
as above; the run ends where the unkilled run ends (tests/mpi/hybrid_elastic.py).

Refused: a dedicated-layout job (its recovery is ``TorchModel`` under ``hpcreduce.train``), and
a ``TrainPipeline`` given to ``State`` (nothing to commit: its job is tracked), on every rank; two
ring neighbours leaving together, before the leave.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, List, Optional, Sequence

from ..ps.colocated import ColocatedTables
from ..ps.colocated.tablewise import TableWiseTables
from ..runtime.context import Context
from ..runtime.failures import revoke
from .embedding_configs import EmbeddingBagConfig, RowOptimizer



def tables_anew(configs: Sequence[EmbeddingBagConfig], optimizer: RowOptimizer, seed: int,
                sharding: str) -> Callable[..., Any]:
    """A colocated job's tables made anew with no row, called with ``comm=`` a growth's context
    (collective); ``grown_from`` then fills them from the tables of before."""
    kind = TableWiseTables if sharding == "table_wise" else ColocatedTables
    return functools.partial(kind, [config.spec(seed) for config in configs], optimizer=optimizer.name,
                             lr=optimizer.lr, seed=seed, empty=True)


class ElasticJob:
    """What ``elastic.State`` calls on a ``HybridWorker`` (the ``job`` handler)."""

    layout: str
    sharding: str
    tables_anew: Optional[Callable[..., Any]]
    module: Any
    store: Any
    collection: Any
    context: Optional[Context]
    comm: Any
    _pushes: List[Any]
    committed_step = 0
    recoveries: List[List[int]]
    attempts_ended = 0
    """Calls of the loop ended under ``elastic.run`` (the same count on every rank): a
    ``TrainPipeline`` drops a batch it planned in an earlier one."""

    @property
    def recovers_in_place(self) -> bool:
        """Whether ``elastic.State`` can track this job and recover it in place (colocated, under
        a fault-tolerant launch): then nothing of a step may reach the tables after its
        ``clock()`` before the loop commits (a ``TrainPipeline`` pulls the next batch after that)."""
        return self.layout == "colocated" and self.context is not None and self.context.ft

    def elastic_problem(self) -> Optional[str]:
        """Why ``State`` cannot track this job (None: it can)."""
        if self.layout != "colocated":
            return ("a start_hybrid(layout=\"dedicated\") job cannot be tracked: its recovery is "
                    "hpcreduce.torch.TorchModel under hpcreduce.train; use layout=\"colocated\" with elastic.State")
        return None

    def elastic_snapshot(self) -> dict:
        """What a commit keeps: the step (the tables committed every push already)."""
        return {"step": int(self.store.clock_value) if self.store is not None else -1}

    def elastic_put_back(self, saved: dict) -> None:
        self.committed_step = int(saved["step"])

    def elastic_layout(self) -> list:
        return [("tables", (len(self.collection.embedding_bag_configs()),), self.sharding)]

    def elastic_receive(self, context: Context) -> None:
        """Rank 0's step (collective: one allgather). With a rank spawned into the job (no store
        yet), a growth (``_grow``), after the recovery among the ranks of before when one is due
        (a replacement: ``Policy(replace=True)``); after a failure (fewer ranks than the
        tables', or their communicator revoked on any rank), the store's recovery set up for its
        next call and this step's calls in flight dropped."""
        told = context.comm.allgather((self.committed_step, self.attempts_ended, self.store is None,
                                       self.store is not None and (self.store.recovery_pending or
                                                                   _revoked(self.store.comm))))
        step, revoked = told[0][0], any(broken for *_, broken in told)
        if any(joining for _, _, joining, _ in told):
            if revoked and self.store is not None:  # a replacement: the ranks of before recover among themselves
                if not self.store.recovery_pending:
                    self._recover_before_next(context, step)
                self.store.recover_now()
            self._grow(context, told[0][1])
            return
        if context.size == self.store.worker_count and not revoked:
            return
        self._recover_before_next(context, step)

    def _recover_before_next(self, context: Context, step: int) -> None:
        """After a failure: this step's calls in flight dropped, the store's recovery (on its own
        communicator, the survivors') set up for its next call, at rank 0's committed ``step``."""
        if step < self.store.clock_value and context.rank == 0:
            print(f"hpcreduce: start_hybrid: the last commit (step {step}) is before the tables' last push (step "
                  f"{self.store.clock_value - 1}): the tables refuse the steps redone, whose dense part reads the "
                  "later rows (commit right after job.clock())", file=sys.stderr, flush=True)
        self._pushes = []
        self.collection.forget_in_flight()

        def prepare() -> None:
            self.store.clock_value = step

        def then(lost: List[int]) -> None:
            self.comm = context.comm
            self.collection.bind(self.store, self.store.worker_count, context)
            self.recoveries.append(lost)
        self.store.recover_before_next(prepare, then)

    def _grow(self, context: Context, attempts: int) -> None:
        """A growth (collective over ``context``, the newcomers included, at a commit): the tables
        made anew over every rank and filled from those of before (``grown_from``: each row or
        table to its owner with its optimizer state, at rank 0's step, each step applied at most
        once still, the replicas made anew); the collection rebound over every rank, and this call
        of the loop ended on each (``attempts``: rank 0's count; a ``TrainPipeline`` drops the
        batch it planned over the ranks of before)."""
        self._pushes = []
        self.collection.forget_in_flight()
        tables = self.tables_anew(comm=context)
        tables.grown_from(self.store)
        tables.on_failure = self.revoke_others
        self.store, self.comm, self.committed_step = tables, context.comm, tables.clock_value
        self.collection.bind(tables, tables.worker_count, context)
        self.attempts_ended = attempts + 1

    def elastic_before_leave(self, going: bool) -> None:
        """A leave, at a commit (collective over every rank, the leaving ones included): the tables
        hand the leaving ranks' shards to the staying ones (``hand_over``: from their replicas)."""
        self.store.hand_over(going)

    def elastic_after_leave(self, context: Context) -> None:
        """On the staying ranks after a leave: the job's communicator is theirs, the collection
        scales pushes and checks batches over them, and this call of the loop ended (a
        ``TrainPipeline`` drops the batch it planned over the ranks of before)."""
        self.comm = context.comm
        self.collection.bind(self.store, self.store.worker_count, context)
        self.attempts_ended += 1

    def revoke_others(self) -> None:
        """On a failure seen by the tables: revoke the context's communicator and the DDP
        wrapper's, so that a peer waiting there for this rank leaves and joins the tables'
        failure agreement (a recovery replaces both)."""
        revoke(self.context.comm)
        if callable(getattr(self.module, "revoke", None)):  # the DDP wrapper (absent: no dense part)
            self.module.revoke()

    def elastic_attempt_ended(self, failed: bool) -> None:
        self.attempts_ended += 1
        if self.store is not None:
            self.store.end_attempt(failed)


def _revoked(comm: Any) -> bool:
    """Whether ``comm`` is revoked (a revoke reaches the ranks one by one: ``elastic_receive`` asks them all)."""
    try:
        return bool(comm.Is_revoked())
    except Exception:  # a freed or broken communicator: recover all the same
        return True
