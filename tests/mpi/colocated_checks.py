"""Colocated tables over real ranks: BSP SGD values against a numpy reference (fixed and
dynamic tables, several widths), replicas bit-identical to their shards, and bad input
refused on every rank before anything moves.

Run under mpirun with 2 or 3 ranks; every rank asserts.
"""
import numpy as np

import hpcreduce
from hpcreduce.ps import Consistency, Dynamic, ParamSpec, PSConfigError, PSInputError, Worker, dynamic_table, start
from hpcreduce.ps.colocated import ColocatedTables, default_init
from hpcreduce.ps.init import PartInit
from hpcreduce.ps.tables import initial_rows
from shared_checks import expect

ctx = hpcreduce.init()
comm, rank, size = ctx.comm, ctx.rank, ctx.size
SPECS = [ParamSpec("a", (300, 4), sparse=True), ParamSpec("b", (50, 3), "float64", sparse=True),
         dynamic_table("d", 2, Dynamic(seed=5))]
LR, STEPS, SEED = 0.25, 5, 7


def batch(r: int, step: int):
    """Rank r's ids (with repeats) and unique-id gradients per table at ``step``: multiples of 1/64,
    so the sums over ranks are exact in any order."""
    rng = np.random.default_rng([r, step])
    out = {}
    for spec in SPECS:
        high = spec.shape[0] or 1000
        ids = rng.integers(0, high, 40) if spec.dynamic is None else rng.integers(-2**40, 2**40, 8).repeat(3)
        unique = np.unique(ids)
        grads = (rng.integers(-8, 9, (len(unique),) + spec.shape[1:]) / 64).astype(spec.dtype)
        out[spec.name] = (ids, unique, grads)
    return out


def reference(asked):
    """Rows of every table after each step, by a dict of rows (the servers' rule: SGD on the summed gradient)."""
    init = default_init(SPECS, SEED)
    rows = {s.name: {} for s in SPECS}

    def value(t, i):
        spec = SPECS[t]
        if i not in rows[spec.name]:
            rows[spec.name][i] = (initial_rows(spec, np.array([i]))[0] if spec.dynamic else init.rows(t, np.array([i]))[0]).copy()
        return rows[spec.name][i]
    history = []
    for step in range(STEPS):
        history.append({s.name: np.array([value(t, int(i)) for i in asked[step][s.name]]) for t, s in enumerate(SPECS)})
        for t, spec in enumerate(SPECS):
            total = {}
            for r in range(size):
                _, unique, grads = batch(r, step)[spec.name]
                for i, g in zip(unique.tolist(), grads):
                    total[i] = total[i] + g if i in total else g.copy()
            for i, g in total.items():
                row = value(t, i)
                row -= LR * g
    return history


def check_bsp_sgd_matches_the_reference_and_replicas_match_their_shards():
    tables = ColocatedTables(SPECS, optimizer="sgd", lr=LR, comm=ctx, seed=SEED, replicas=True)
    assert tables.worker_count == size and tables.replica is not None
    asked = [{name: ids for name, (ids, _, _) in batch(r, step).items()} for step in range(STEPS) for r in [rank]]
    want = reference([{name: ids for name, (ids, _, _) in batch(rank, step).items()} for step in range(STEPS)])
    for step in range(STEPS):
        mine = batch(rank, step)
        pulled = tables.pull_rows_many_async({name: ids for name, (ids, _, _) in mine.items()}).wait()
        for name, rows in pulled.items():
            assert rows.dtype == want[step][name].dtype and np.array_equal(rows, want[step][name]), (rank, step, name)
        results = tables.push_rows_many_async({name: (unique, grads) for name, (_, unique, grads) in mine.items()}).wait()
        assert all(result.duplicates == 0 for result in results.values()), results
        assert tables.clock() == step + 1
    # the replica on the ring successor equals the owner's shard, bit for bit (dynamic rows included)
    successor = tables.layout.rank_of(tables.layout.successor[rank])
    predecessor = tables.layout.rank_of(tables.layout.predecessor[rank])
    for t in range(len(SPECS)):
        theirs = comm.sendrecv(tables.store.export(t), dest=successor, source=predecessor)
        ids, values, _ = tables.replica.export(t)
        order, their_order = np.argsort(ids), np.argsort(theirs[0])
        assert np.array_equal(ids[order], theirs[0][their_order]), (rank, t)
        assert np.array_equal(values[order], theirs[1][their_order]), (rank, t)
    assert asked


def check_a_step_pushed_twice_is_applied_once():
    tables = ColocatedTables(SPECS, lr=LR, comm=ctx, seed=SEED)
    _, unique, grads = batch(rank, 0)["a"]
    first = tables.push_rows_many_async({"a": (unique, grads)}).wait()["a"]
    after = tables.pull_rows_many_async({"a": unique}).wait()["a"]
    again = tables.push_rows_many_async({"a": (unique, grads)}).wait()["a"]  # the same step (no clock between)
    assert first.duplicates == 0 and again.duplicates == 1, (first, again)
    assert np.array_equal(tables.pull_rows_many_async({"a": unique}).wait()["a"], after)


def check_equals_a_dedicated_server_run():
    """3 ranks: 1 server + 2 workers (``ps.start``, BSP) against colocated tables on the 2 workers (rows made
    on first touch, and made at start), same pushes: the same rows bit for bit."""
    if size != 3:
        return
    every = {"a": np.arange(300), "b": np.arange(50)}
    role = start(SPECS[:2], default_init(SPECS[:2], SEED), servers=1, consistency=Consistency("bsp"), lr=LR, comm=ctx)
    workers = comm.Split(0 if rank else 1, rank)
    if isinstance(role, Worker):
        tables = ColocatedTables(SPECS[:2], lr=LR, comm=workers, seed=SEED)  # rows made on first touch
        eager = ColocatedTables(SPECS[:2], lr=LR, comm=workers, init=default_init(SPECS[:2], SEED))  # made at start
        for step in range(STEPS):
            mine = {name: pair for name, pair in batch(rank - 1, step).items() if name in every}
            for client in (role, tables, eager):
                client.pull_rows_many_async({name: ids for name, (ids, _, _) in mine.items()}).wait()
                client.push_rows_many_async({name: (u, g) for name, (_, u, g) in mine.items()}).wait()
                client.clock()
        dedicated = role.pull_rows_many_async(every).wait()
        role.release()
        colocated, made = tables.pull_rows_many_async(every).wait(), eager.pull_rows_many_async(every).wait()
        for name in every:
            assert np.array_equal(dedicated[name], colocated[name]), name
            assert np.array_equal(dedicated[name], made[name]), name
    else:
        role.serve()


def check_a_push_of_rows_as_they_arrived_equals_the_per_table_push():
    """``wait_stacked`` + ``push_stacked_async`` (the collection's path: no regrouping without
    replicas, through the per-table push with them) give the rows the per-table calls give, bit
    for bit; NaN on one rank is refused on every rank, nothing applied."""
    specs = [SPECS[0], ParamSpec("c", (200, 4), sparse=True)]
    names = ["c", "a"]  # stacked in another order than the tables'
    every = {"a": np.arange(300), "c": np.arange(200)}
    for replicas in (True, False):
        made = default_init(specs, SEED)  # rows made at start: the owner reuses a read's slots
        plain = ColocatedTables(specs, lr=LR, comm=ctx, init=made, replicas=replicas)
        stacked = ColocatedTables(specs, lr=LR, comm=ctx, init=made, replicas=replicas)
        for step in range(STEPS):
            rng = np.random.default_rng([rank, step, 9])
            mine = {name: np.unique(rng.integers(0, 200, 30)) for name in names}
            grads = {name: (rng.integers(-8, 9, (len(ids), 4)) / 64).astype(np.float32) for name, ids in mine.items()}
            rows = plain.pull_rows_many_async(mine).wait()
            handle = stacked.pull_rows_many_async(mine)
            arrived, at = handle.wait_stacked(names)
            assert np.array_equal(arrived[at], np.concatenate([rows[n] for n in names])), (rank, step, replicas)
            plain.push_rows_many_async({n: (mine[n], grads[n]) for n in names}).wait()
            wire = np.empty_like(arrived)
            wire[at] = np.concatenate([grads[n] for n in names])
            stacked.push_stacked_async(handle, wire).wait()
            plain.clock()
            stacked.clock()
        got, want = stacked.pull_rows_many_async(every).wait(), plain.pull_rows_many_async(every).wait()
        assert all(np.array_equal(got[n], want[n]) for n in every), (rank, replicas)
        plain.clock()
        stacked.clock()
    assert ColocatedTables(SPECS[:2], comm=ctx, seed=SEED).pull_rows_many_async(
        {"a": np.arange(3), "b": np.arange(3)}).wait_stacked(["a", "b"]) is None  # two widths: per table
    handle = plain.pull_rows_many_async({"a": np.arange(10)})  # the other ranks' pushes leave as they are
    before, at = handle.wait_stacked(["a"])
    before = before[at].copy()
    bad = np.ones((10, 4), np.float32) * (np.nan if rank == size - 1 else 1)
    expect(PSInputError, "NaN or Inf", lambda: plain.push_stacked_async(handle, bad).wait())
    assert np.array_equal(plain.pull_rows_many_async({"a": np.arange(10)}).wait()["a"], before)


def check_bad_input_raises_on_every_rank_and_changes_nothing():
    tables = ColocatedTables(SPECS, lr=LR, comm=ctx, seed=SEED)
    ids = np.arange(10)
    before = tables.pull_rows_many_async({"a": ids}).wait()["a"]
    last = size - 1
    cases = [
        ({"a": ids.astype(np.float32) if rank == last else ids}, "ids must be a one-dimensional integer array"),
        ({"a": ids + 295 if rank == last else ids}, "row id 300 out of range [0, 300)"),
        ({"nope" if rank == last else "a": ids}, "unknown table 'nope'"),
        ({"a": ids} if rank == last else {"a": ids, "b": ids}, "every rank must make the same call"),
    ]
    for request, fragment in cases:
        message = expect(PSInputError, fragment, lambda: tables.pull_rows_many_async(request).wait())
        assert f"rank {last}" in message, message
    good = np.ones((10, 4), np.float32)
    pushes = [
        ({"a": (np.r_[ids[:9], 3], good)}, "ids must be unique"),
        ({"a": (ids, good[:, :3])}, "has shape (10, 3), the table needs (10, 4)"),
        ({"a": (ids, good.astype(np.float64))}, "has dtype float64, the table needs float32"),
        ({"a": (ids, good * np.nan)}, "NaN or Inf"),
    ]
    for request, fragment in pushes:
        bad = request if rank == last else {"a": (ids, good)}
        expect(PSInputError, fragment, lambda: tables.push_rows_many_async(bad).wait())
    assert np.array_equal(tables.pull_rows_many_async({"a": ids}).wait()["a"], before)  # nothing applied
    expect(PSInputError, "takes a mapping of table name -> ids, got list", lambda: tables.pull_rows_many_async({"a": ids} if rank else [1, 2]))
    assert tables.clock() == 1
    tables.release()
    expect(PSInputError, "after release()", lambda: tables.pull_rows_many_async({"a": ids}))


def check_tables_declared_differently_are_refused_everywhere():
    other = [ParamSpec("a", (301 if rank == 0 else 300, 4), sparse=True)]
    expect(PSConfigError, "the ranks declare different tables", lambda: ColocatedTables(other, comm=ctx))
    dense = [ParamSpec("w", (3, 4))] if rank == 0 else SPECS[:1]
    expect(PSConfigError, "rank 0: table 'w' is dense", lambda: ColocatedTables(dense, comm=ctx))
    expect(PSConfigError, "unknown optimizer", lambda: ColocatedTables(SPECS, optimizer="nope", comm=ctx))
    wrong = PartInit(SPECS, lambda t, flat: np.zeros(len(flat) + (rank == 0), np.float32))  # one value too many
    expect(PSConfigError, "rank 0: ValueError", lambda: ColocatedTables(SPECS, comm=ctx, init=wrong))


check_bsp_sgd_matches_the_reference_and_replicas_match_their_shards()
check_a_step_pushed_twice_is_applied_once()
check_equals_a_dedicated_server_run()
check_a_push_of_rows_as_they_arrived_equals_the_per_table_push()
check_bad_input_raises_on_every_rank_and_changes_nothing()
check_tables_declared_differently_are_refused_everywhere()
if rank == 0:
    print("colocated checks passed", flush=True)
