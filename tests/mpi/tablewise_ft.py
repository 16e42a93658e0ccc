"""A trainer SIGKILLed under table-wise sharding, under mpirun --with-ft ulfm (3 ranks).

The same BSP SGD run twice in one launch (three tables, one owned by each rank; bags of two ids,
the global batch split over the live ranks): unkilled, then with rank 1 SIGKILLed in the middle
of step 3 and rank 2 in the middle of step 6: with its bags pooled and nothing pushed
(``before-push``), or with its pooled gradients posted and not received by all (``in-push``).
Each time the survivors promote the lost owner's tables from the replica on its ring successor
and redo the step over the new split (the second loss is rebuilt from replicas re-made after
the first, holding the table adopted from rank 1); rank 0 must end alone on the unkilled run's
rows bit for bit (gradients are multiples of 1/16, so any split sums them exactly), every step
applied once and, after the first recovery, each replica equal to its owner's table.
Run: python tablewise_ft.py before-push|in-push.
"""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.ps import ParamSpec, PSInputError
from hpcreduce.ps.colocated.tablewise import TableWiseTables
from hpcreduce.runtime.failures import is_process_failure
from shared_checks import abort_job_on_error, expect

abort_job_on_error()
ctx = hpcreduce.init(ft=True)
assert ctx.size == 3, "run with 3 ranks"
SPECS = [ParamSpec("a", (500, 4), sparse=True), ParamSpec("b", (300, 4), sparse=True),
         ParamSpec("c", (200, 4), sparse=True)]
STEPS, EXAMPLES, KILLS = 8, 48, {3: 1, 6: 2}  # step: world rank SIGKILLed in it
WHERE = sys.argv[1]  # "before-push": bags pooled, nothing pushed; "in-push": the push posted


def step_batch(step: int, share: int, shares: int):
    """This share's lookups per table (bags of two ids, one bag per example) and its bags' gradients."""
    examples = np.arange(share, EXAMPLES, shares)
    rng = np.random.default_rng([step, 99])
    lookups, grads = [], []
    for t, spec in enumerate(SPECS):
        ids = rng.integers(0, spec.shape[0], (EXAMPLES, 2))
        every = ((np.arange(EXAMPLES)[:, None] + np.arange(4) + t) % 7 - 3) / 16
        lookups.append((ids[examples].reshape(-1).astype(np.int64), np.full(len(examples), 2, np.int64), None))
        grads.append(every[examples].astype(np.float32))
    return lookups, grads


def replicas_match(tables):
    """Each rank's replicas equal its ring predecessor's tables."""
    theirs = tables.comm.sendrecv({t: tables.values[t] for t in tables.mine}, dest=tables.successor,
                                  source=tables.predecessor)
    assert sorted(theirs) == sorted(tables.replicas), (sorted(theirs), sorted(tables.replicas))
    for t, rows in theirs.items():
        assert np.array_equal(rows, tables.replicas[t][0]), t


def run(kill: bool):
    tables = TableWiseTables(SPECS, lr=0.5, comm=ctx, seed=1)
    assert tables.replicas, "replicas are on under fault tolerance"
    lost = []
    while tables.clock_value < STEPS:
        step, push = tables.clock_value, None
        try:
            lookups, grads = step_batch(step, tables.rank, tables.worker_count)
            pooled = tables.pool_async(lookups).wait()
            assert all(np.isfinite(rows).all() for rows in pooled)
            dies = kill and KILLS.get(step) == MPI.COMM_WORLD.Get_rank()
            if dies and WHERE == "before-push":
                os.kill(os.getpid(), signal.SIGKILL)
            push = tables.push_pooled_async(grads)
            if dies:  # the gradients posted, not all received
                os.kill(os.getpid(), signal.SIGKILL)
            push.wait()
            tables.clock()
        except MPI.Exception as error:
            if not is_process_failure(error, tables.comm):
                raise
            lost += tables.recover()
            if push is not None:  # the push the failure interrupted is gone: it must be made again
                expect(PSInputError, "interrupted by a process failure", push.wait)
            if tables.worker_count > 1:
                replicas_match(tables)
    every = {spec.name: np.arange(spec.shape[0]) for spec in SPECS}
    return tables, lost, tables.pull_rows_many_async(every).wait()


reference, lost, want = run(kill=False)
assert lost == []
reference.release()
tables, lost, got = run(kill=True)
assert lost == [1, 2] and tables.worker_count == 1 and not tables.replicas, (lost, tables.worker_count)
for name in want:
    assert np.array_equal(got[name], want[name]), (name, np.abs(got[name] - want[name]).max())
assert sorted(tables.last_step) == [0, 1, 2] and all(s == STEPS - 1 for s in tables.last_step.values()), \
    tables.last_step
print("table-wise ft: ranks 1 and 2 killed at steps 3 and 6, rank 0 ends alone on the unkilled rows bit for bit",
      flush=True)
