"""Several tables' rows in one request per server (PULL_ROWS_MANY / PUSH_ROWS_MANY).

Run under mpirun with 4 ranks (2 servers, 2 workers). Twin tables get the same pushes,
one per table (``push_rows``) and all at once (``push_rows_many_async``): their rows stay
bit for bit equal, under ASP, BSP and with replication (the backup's replica is compared
with the primary's shard); a duplicate push applies nothing; bad requests are refused whole.
"""

import numpy as np

import hpcreduce
from hpcreduce.ps import Consistency, PSInputError, PSRefusedError, ParamSpec, Server
from hpcreduce.ps.protocol import HEADER_LEN, TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, Op, Rep, Status, request
from hpcreduce.ps.roles import Tables, initial_layout, make_role
from hpcreduce.ps.shard_state import ShardState
from hpcreduce.ps.tables import Dynamic, dynamic_table
from hpcreduce.runtime.nodes import rank_nodes
from shared_checks import expect

ctx = hpcreduce.init()
comm, rank, size = ctx.comm, ctx.rank, ctx.size
assert size == 4, "run with 4 ranks"
SERVERS = 2
TWINS = {"a": (500, 4), "b": (64, 3), "c": (1000, 8)}
SPECS = [ParamSpec(f"{name}{twin}", shape, sparse=True) for name, shape in TWINS.items() for twin in ("", "2")]
SPECS += [dynamic_table(f"d{twin}", (4,), Dynamic(admit_after=1, init_scale=0.0)) for twin in ("", "2")]  # start equal
INITIAL = {spec.name: np.random.default_rng(len(spec.name[0])).standard_normal(spec.shape).astype(np.float32)
           for spec in SPECS if spec.dynamic is None}
workers_comm = comm.Split(int(rank >= SERVERS), rank)


def session(consistency: Consistency, replicated: bool):
    """Train the twins a few steps; servers return their shard (and replica) states."""
    tables = Tables.of(SPECS, "adagrad", 0.1, consistency)
    layout = initial_layout(ctx, tables, SERVERS, rank_nodes(ctx.comm), replicated=replicated)

    def shards(key):
        keys = [key, layout.neighbours(key)[1]] if replicated else [key]
        return ShardState.create_many(layout, keys, dict(INITIAL), tables.optimizers)
    role = make_role(ctx, layout, tables, shards)
    if isinstance(role, Server):
        role.serve()
        return role
    worker, rng = role, np.random.default_rng(100 + role.slot)
    for step in range(3):
        ids = {name: rng.integers(0, TWINS.get(name, (10**12,))[0], 40) for name in ("a", "b", "c", "d")}
        many = worker.pull_rows_many_async(ids)
        assert len(many.parts) == SERVERS, "one request per server for every table"
        rows = many.wait()
        for name, got in rows.items():
            twin = worker.pull_rows(name + "2", ids[name])
            assert got.shape == twin.shape and np.array_equal(got, twin), (name, step)
        pushes = {}
        for name, wanted in ids.items():
            unique = np.unique(wanted)[::-1]  # not sorted: the worker sorts
            pushes[name] = (unique, rng.standard_normal((len(unique),) + rows[name].shape[1:]).astype(np.float32))
        for turn in range(2):  # the workers take turns: both twins see the pushes in one order
            workers_comm.Barrier()
            if turn == worker.slot:
                for name, (unique, grads) in pushes.items():
                    worker.push_rows(name + "2", unique, grads)
                results = worker.push_rows_many_async(pushes).wait()
                assert all(r.duplicates == 0 and r.pieces >= 1 for r in results.values()), results
                again = worker.push_rows_many_async(pushes).wait()
                assert all(r.duplicates == r.pieces for r in again.values()), ("exactly once", again)
        workers_comm.Barrier()
        worker.clock()
    if consistency.kind == "asp":
        bad_requests(worker)
        for turn in range(2):
            workers_comm.Barrier()
            if turn == worker.slot:
                float16_wire(worker)
    workers_comm.Barrier()
    ids = {name: np.arange(TWINS.get(name, (64,))[0]) for name in ("a", "b", "c")}
    final = worker.pull_rows_many_async(ids).wait()
    for name in ids:
        assert np.array_equal(final[name], worker.pull_rows(name + "2", ids[name])), name
    worker.release()
    return None


def float16_wire(worker):
    """Values travel as float16 in a MANY request as in a one-table one (widened on arrival)."""
    worker.wire_dtype = np.dtype(np.float16)
    ids = {"a": np.arange(10 * worker.slot, 10 * worker.slot + 10), "c": np.array([5 + worker.slot, 900])}
    grads = {name: np.full((len(i), TWINS[name][1]), 0.25 + worker.slot, np.float32) for name, i in ids.items()}
    for name in ids:
        worker.push_rows(name + "2", ids[name], grads[name])
    worker.push_rows_many_async({name: (ids[name], grads[name]) for name in ids}).wait()
    pulled = worker.pull_rows_many_async(ids).wait()
    for name in ids:
        assert np.array_equal(pulled[name], worker.pull_rows(name + "2", ids[name])), name
        assert pulled[name].dtype == np.float32
    worker.wire_dtype = None


def bad_requests(worker):
    """Refused on the worker before anything is sent, or by the server whole."""
    expect(PSInputError, "unknown table 'nope'", lambda: worker.pull_rows_many_async({"a": [1], "nope": [2]}))
    expect(PSInputError, "ids must be unique", lambda: worker.push_rows_many_async(
        {"a": (np.array([1]), np.ones((1, 4), np.float32)), "b": (np.array([2, 2]), np.ones((2, 3), np.float32))}))
    expect(PSInputError, "mapping of table name", lambda: worker.pull_rows_many_async([("a", [1])]))
    server = worker.layout.shard_ranks[0]
    t = worker.layout.table_ids["a"]
    for directory, status in ((np.array([[t, 1, 4, 1], [t, 1, 4, 1]]), Status.BAD_IDS),  # a table twice
                              (np.array([[t, 2, 4, 1]]), Status.BAD_SIZE),               # more ids than sent
                              (np.array([[t, 1, 5, 1]]), Status.BAD_SIZE)):              # wrong width
        header = request(Op.PULL_ROWS_MANY, -1, worker.slot, worker.clock_value, 1, 0, len(directory))
        comm.Send(header, server, TAG_REQUEST)
        comm.Send(directory.astype(np.int64), server, TAG_PAYLOAD)
        comm.Send(np.array([0], np.int64), server, TAG_PAYLOAD)
        answer = np.empty(HEADER_LEN, np.int64)
        comm.Recv(answer, server, TAG_REPLY)
        comm.Recv(np.empty(0, np.uint8), server, TAG_REPLY)
        assert answer[Rep.STATUS] == status, (answer, status)
    owners = {name: worker.layout.placement.row_owners(worker.layout.table_ids[name], np.arange(64))
              for name in ("a", "b")}
    a_ids, b_ids = np.flatnonzero(owners["a"] == 0)[:3], np.flatnonzero(owners["b"] == 0)[:2]
    before = worker.pull_rows("a", a_ids)
    expect(PSRefusedError, "NaN or Inf", lambda: worker.push_rows_many_async({  # one request, refused whole
        "a": (a_ids, np.ones((len(a_ids), 4), np.float32)),
        "b": (b_ids, np.full((len(b_ids), 3), np.nan, np.float32))}).wait())
    assert np.array_equal(worker.pull_rows("a", a_ids), before), "a refused request applied nothing"

for consistency in (Consistency("asp"), Consistency("bsp")):
    server = session(consistency, replicated=False)
for consistency in (Consistency("ssp", 1), Consistency("bsp")):
    server = session(consistency, replicated=True)
    if server is not None:  # the replica a server holds equals its predecessor's shard
        mine = {t: (table.values.copy(), table.count if table.dynamic else None)
                for t, table in server.state.tables.items()}
        theirs = comm.sendrecv(mine, dest=1 - rank, source=1 - rank)
        for t, table in server.forwarding.replica.state.tables.items():
            values, count = theirs[t]
            held = table.count if table.dynamic else len(values)
            assert np.array_equal(table.values[:held], values[:held]), ("replica", t)
comm.Barrier()
if rank == 0:
    print("ps many tables: asp, bsp, replicated ssp/bsp: all checks passed", flush=True)
