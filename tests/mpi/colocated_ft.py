"""A trainer SIGKILLed under the colocated layout, under mpirun --with-ft ulfm (3 ranks).

The same BSP SGD run twice in one launch, the global batch split over the live ranks:
unkilled, then with rank 1 SIGKILLed in the middle of step 3 and rank 2 in the middle of
step 6: with its rows pulled and nothing pushed (``before-push``), or with its push posted
and not received by all (``in-push``: the others wait in the ``Ialltoallv``). Each time the
survivors rebuild the lost shard from the replica on its ring successor and redo the step
over the new split (the second loss is rebuilt from a replica re-made after the first,
holding rows adopted from rank 1); rank 0 must end alone on the unkilled run's rows bit for
bit (gradients are multiples of 1/16, so any split sums them exactly), with every step
applied once and, after the first recovery, each replica equal to its shard.
Run: python colocated_ft.py before-push|in-push.
"""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.ps import Dynamic, ParamSpec, PSInputError, dynamic_table
from hpcreduce.ps.colocated import ColocatedTables
from hpcreduce.runtime.failures import is_process_failure
from shared_checks import abort_job_on_error, expect


abort_job_on_error()
ctx = hpcreduce.init(ft=True)
assert ctx.size == 3, "run with 3 ranks"
SPECS = [ParamSpec("a", (500, 4), sparse=True), dynamic_table("d", 2, Dynamic(seed=3))]
STEPS, EXAMPLES, KILLS = 8, 48, {3: 1, 6: 2}  # step: world rank SIGKILLed in it
WHERE = sys.argv[1]  # "before-push": rows pulled, nothing pushed; "in-push": the push posted


def step_rows(step: int, share: int, shares: int):
    """This share's ids per table (one per example) and its unique ids' summed gradients."""
    examples = np.arange(share, EXAMPLES, shares)
    rng = np.random.default_rng([step, 99])
    every = {"a": rng.integers(0, 500, EXAMPLES), "d": rng.integers(-2**50, 2**50, EXAMPLES) % 37}
    grads = ((np.arange(EXAMPLES) % 7) - 3) / 16
    out = {}
    for spec in SPECS:
        ids = every[spec.name][examples]
        unique, inverse = np.unique(ids, return_inverse=True)
        total = np.zeros((len(unique),) + spec.shape[1:], np.float32)
        np.add.at(total, inverse, grads[examples][:, None].astype(np.float32))
        out[spec.name] = (ids, unique, total)
    return out


def replicas_match(tables):
    """Each rank's replica equals its ring predecessor's shard."""
    successor = tables.layout.rank_of(tables.layout.successor[tables.key])
    predecessor = tables.layout.rank_of(tables.layout.predecessor[tables.key])
    for t in range(len(SPECS)):
        ids, values, _ = tables.comm.sendrecv(tables.store.export(t), dest=successor, source=predecessor)
        mine_ids, mine_values, _ = tables.replica.export(t)
        assert np.array_equal(np.sort(ids), np.sort(mine_ids)), t
        assert np.array_equal(values[np.argsort(ids)], mine_values[np.argsort(mine_ids)]), t


def run(kill: bool):
    tables = ColocatedTables(SPECS, lr=0.5, comm=ctx, seed=1)
    assert tables.replica is not None, "replicas are on under fault tolerance"
    lost = []
    while tables.clock_value < STEPS:
        step, handle = tables.clock_value, None
        try:
            mine = step_rows(step, tables.rank, tables.worker_count)
            rows = tables.pull_rows_many_async({name: ids for name, (ids, _, _) in mine.items()}).wait()
            assert all(np.isfinite(r).all() for r in rows.values())
            dies = kill and KILLS.get(step) == MPI.COMM_WORLD.Get_rank()
            if dies and WHERE == "before-push":
                os.kill(os.getpid(), signal.SIGKILL)
            handle = tables.push_rows_many_async({n: (u, g) for n, (_, u, g) in mine.items()})
            if dies:  # the gradients posted, not all received
                os.kill(os.getpid(), signal.SIGKILL)
            results = handle.wait()
            assert all(result.duplicates == 0 for result in results.values()), results
            tables.clock()
        except MPI.Exception as error:
            if not is_process_failure(error, tables.comm):
                raise
            lost += tables.recover()
            if handle is not None:  # the push the failure interrupted is gone: it must be made again
                expect(PSInputError, "interrupted by a process failure", handle.wait)
            if tables.worker_count > 1:
                replicas_match(tables)
    everything = {"a": np.arange(500), "d": np.arange(37)}
    return tables, lost, tables.pull_rows_many_async(everything).wait()


reference, lost, want = run(kill=False)
assert lost == []
tables, lost, got = run(kill=True)
assert lost == [1, 2] and tables.worker_count == 1 and tables.replica is None, (lost, tables.worker_count)
for name in want:
    assert np.array_equal(got[name], want[name]), (name, np.abs(got[name] - want[name]).max())
assert all(step == STEPS - 1 for step in tables.store.last_step.values()), tables.store.last_step
print("colocated ft: ranks 1 and 2 killed at steps 3 and 6, rank 0 ends alone on the unkilled rows bit for bit",
      flush=True)
