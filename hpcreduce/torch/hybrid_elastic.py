"""A colocated ``start_hybrid`` job under ``hpcreduce.elastic``: a SIGKILLed rank survived in place.

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
(``elastic_after_leave``), nothing rolled back. Refused: a dedicated-layout job (its recovery is
``TorchModel`` under ``hpcreduce.train``), and a ``TrainPipeline`` given to ``State`` (nothing
to commit: its job is tracked), on every rank; two ring neighbours leaving together, before the
leave; growth or replacement (the tables take no new shard holder: a rank spawned into the job
makes nothing in ``start_hybrid`` and its sync is refused on every rank), before any value moves.
"""
from __future__ import annotations

import sys
from typing import Any, List, Optional

from ..errors import UnsupportedInputError
from ..runtime.context import Context
from ..runtime.failures import revoke

GROWTH = "a start_hybrid job's tables take no new rank (growth and replacement are not supported; shrinking is)"


class ElasticJob:
    """What ``elastic.State`` calls on a ``HybridWorker`` (the ``job`` handler)."""

    layout: str
    sharding: str
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
        if self.store is None:  # a rank spawned into the job (``start_hybrid`` made nothing on it)
            return [("tables", (0,), f"none on a rank spawned into the job: {GROWTH}")]
        return [("tables", (len(self.collection.embedding_bag_configs()),), self.sharding)]

    def elastic_receive(self, context: Context) -> None:
        """Rank 0's step (collective: one allgather); after a failure (fewer ranks than the
        tables', or their communicator revoked on any rank), the store's recovery set up for its
        next call and this step's calls in flight dropped."""
        if self.store is None or context.size > self.store.worker_count:
            raise UnsupportedInputError(GROWTH)
        told = context.comm.allgather((self.committed_step, _revoked(self.store.comm)))
        step, revoked = told[0][0], any(flag for _, flag in told)
        if context.size == self.store.worker_count and not revoked:
            return
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
