"""Dynamic tables over real servers: values under BSP, SSP and ASP against what the pushes
imply, admission, budgets, and bad input refused on every rank before anything moves.

Run under mpirun with 4 ranks (2 servers, 2 workers); every rank asserts.
"""
import numpy as np

import hpcreduce
from hpcreduce.ps import Consistency, Dynamic, ParamSpec, PSConfigError, PSInputError, Server, dynamic_table, start
from hpcreduce.ps.stats import merge_summaries
from hpcreduce.ps.tables import initial_rows
from shared_checks import expect

ctx = hpcreduce.init()
comm, rank, size = ctx.comm, ctx.rank, ctx.size
assert size == 4, "run with 4 ranks"
SERVERS, WIDTH, STEPS = 2, 4, 6
workers_comm = comm.Split(int(rank >= SERVERS), rank)


def batch_ids(slot: int, step: int) -> np.ndarray:
    """The ids a worker pushes at a step: shared hot ids, its own, and ids anywhere in int64."""
    rng = np.random.default_rng([slot, step])
    return np.unique(np.concatenate([np.arange(-3, 5), rng.integers(-2**63, 2**63 - 1, 20, dtype=np.int64),
                                     1000 * (slot + 1) + np.arange(step % 3)]))


def run(consistency: Consistency, dynamic: Dynamic):
    """Every worker pushes gradient 1 for its ids each step (SGD, lr 1); returns each worker's
    final pull of every id pushed, and the servers' summary."""
    spec = dynamic_table("emb", WIDTH, dynamic)
    role = start([spec], lambda: {}, servers=SERVERS, consistency=consistency, optimizer="sgd", lr=1.0, comm=ctx)
    summary, pulled = None, None
    if isinstance(role, Server):
        role.serve()
        summary = role.state.summary()
    else:
        slot = rank - SERVERS
        for step in range(STEPS):
            ids = batch_ids(slot, step)
            assert np.isfinite(role.pull_rows("emb", ids)).all()
            role.push_rows("emb", ids, np.ones((len(ids), WIDTH), np.float32))
            role.clock()
        every = np.unique(np.concatenate([batch_ids(s, t) for s in range(2) for t in range(STEPS)]))
        workers_comm.Barrier()  # both workers pushed everything (ASP applies on arrival)
        pulled = role.pull_rows("emb", every)
        role.release()
    return spec, pulled, merge_summaries(comm.allgather(summary), 2), comm.allgather(summary)


def pushes_of(ids: np.ndarray) -> np.ndarray:
    """How many pushes (worker, step) each id got."""
    return np.array([sum(int(i in batch_ids(s, t)) for s in range(2) for t in range(STEPS)) for i in ids])


def check_values_match_the_pushes_under_every_consistency():
    for consistency in (Consistency("bsp"), Consistency("ssp", 2), Consistency("asp")):
        spec, pulled, _, summaries = run(consistency, Dynamic(seed=4))
        if pulled is not None:
            every = np.unique(np.concatenate([batch_ids(s, t) for s in range(2) for t in range(STEPS)]))
            expected = initial_rows(spec, every) - pushes_of(every)[:, None]
            assert np.allclose(pulled, expected), (consistency, np.abs(pulled - expected).max())
        servers = [s for s in summaries if s]
        assert sum(s["dynamic_rows"]["rows"] for s in servers) == sum(s["dynamic_rows"]["admitted"] for s in servers)
        assert all(s["dynamic_rows"]["bytes"] > 0 and s["dynamic_rows"]["dropped"] == 0 for s in servers)


def check_admission_drops_the_first_sightings():
    spec, pulled, _, summaries = run(Consistency("asp"), Dynamic(admit_after=2))
    if pulled is not None:
        every = np.unique(np.concatenate([batch_ids(s, t) for s in range(2) for t in range(STEPS)]))
        expected = initial_rows(spec, every) - np.maximum(pushes_of(every) - 1, 0)[:, None]
        assert np.allclose(pulled, expected), np.abs(pulled - expected).max()
    dropped = sum(s["dynamic_rows"]["dropped"] for s in summaries if s)
    assert dropped >= 40, dropped  # every id's first push, at least


def check_bad_input_is_refused_everywhere():
    spec = dynamic_table("emb", WIDTH)
    expect(PSConfigError, "admit_after must be a whole number >= 1",
           lambda: start([dynamic_table("emb", 2, Dynamic(admit_after=-2))], lambda: {}, servers=2, comm=ctx))
    expect(PSConfigError, "holds no row",
           lambda: start([dynamic_table("emb", 2, Dynamic(budget_bytes=10))], lambda: {}, servers=2, comm=ctx))
    mine = spec if rank != 3 else ParamSpec("emb", (1000, WIDTH), sparse=True)
    expect(PSConfigError, "the ranks declare different tables: table 0",
           lambda: start([mine], lambda: {"emb": np.zeros((1000, WIDTH), np.float32)}, servers=2, comm=ctx))
    role = start([spec], lambda: {}, servers=2, comm=ctx)
    if isinstance(role, Server):
        role.serve()
        return
    expect(PSInputError, "id 18446744073709551615 is outside int64",
           lambda: role.pull_rows("emb", [2**64 - 1]))
    expect(PSInputError, "id 9223372036854775808 is outside int64",
           lambda: role.push_rows("emb", np.array([2**63], np.uint64), np.ones((1, WIDTH), np.float32)))
    role.release()


for check in (check_values_match_the_pushes_under_every_consistency, check_admission_drops_the_first_sightings,
              check_bad_input_is_refused_everywhere):
    check()
    comm.Barrier()
if rank == 0:
    print("ps dynamic: all checks passed", flush=True)
