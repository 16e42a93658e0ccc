"""Dynamic tables without MPI: the id index, admission, budgets and eviction, and the ways a
shard's rows travel (a replica's copy, fragments moved to another placement, checkpoints)."""
import copy
from collections import Counter

import numpy as np
import pytest

from hpcreduce.errors import CheckpointMismatchError
from hpcreduce.ps.dynamic_rows import DynamicTable, budget_rows, held_bytes
from hpcreduce.ps.fragments import assemble, cut
from hpcreduce.ps.id_index import IdIndex
from hpcreduce.ps.optimizers import make_optimizer
from hpcreduce.ps.placement import place
from hpcreduce.ps.shard_state import ShardState
from hpcreduce.ps.tables import Dynamic, ParamSpec, dynamic_table, initial_rows
from hpcreduce.train.ps import shard_checkpoints

SGD = make_optimizer("sgd", 1.0)


def budget_of(rows: int, spec: ParamSpec, optimizer=SGD) -> int:
    return held_bytes(rows, spec, optimizer)


def table(spec: ParamSpec, optimizer=SGD) -> DynamicTable:
    return DynamicTable(0, spec, optimizer, slot_count=2)


def push(rows: DynamicTable, ids, events: Counter, grad: float = 1.0) -> np.ndarray:
    """One SGD update of ``ids`` (lr 1) as the engine does it: admit, then update; the slots."""
    ids = np.unique(np.asarray(ids, dtype=np.int64))
    grads = np.full((len(ids),) + tuple(rows.spec.shape[1:]), grad, np.float32)
    slots, kept = rows.admit(ids, grads, events)
    rows.values[slots] -= kept
    rows.version += 1
    return slots


def test_id_index_finds_what_it_holds_across_growth():
    rng = np.random.default_rng(1)
    held = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 50_000, dtype=np.int64))
    index = IdIndex()
    for part in np.array_split(np.arange(len(held)), 7):  # grows several times on the way
        index.insert(held[part], part)
    assert (index.find(held) == np.arange(len(held))).all()
    strangers = np.setdiff1d(rng.integers(-2**62, 2**62, 5_000, dtype=np.int64), held)
    assert (index.find(strangers) == -1).all()
    assert 2 * index.count <= len(index.keys)


def test_rows_are_admitted_on_the_kth_push_and_read_as_initial_before():
    spec = dynamic_table("e", 3, Dynamic(admit_after=3, seed=5))
    rows, events = table(spec), Counter()
    ids = np.array([-7, 2**62, 11], np.int64)
    for _ in range(2):
        assert len(push(rows, ids, events)) == 0  # seen, gradient dropped
    assert rows.count == 0 and (rows.rows(ids) == initial_rows(spec, ids)).all()
    assert len(push(rows, ids, events)) == 3  # third push: admitted and applied
    push(rows, ids, events)
    assert np.allclose(rows.rows(ids), initial_rows(spec, ids) - 2)
    assert events == Counter(seen=9, dropped=6, admitted=3)


def test_admission_probability_admits_about_that_share():
    spec = dynamic_table("e", 2, Dynamic(admit_probability=0.25))
    rows, events = table(spec), Counter()
    push(rows, np.arange(20_000), events)
    assert 0.22 < rows.count / 20_000 < 0.28, rows.count
    assert events["dropped"] == 20_000 - rows.count


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_budget_is_never_passed_and_the_hot_rows_stay(eviction):
    spec = dynamic_table("e", 4, Dynamic(budget_bytes=budget_of(1000, dynamic_table("e", 4)), eviction=eviction))
    assert budget_rows(spec, SGD) == 1000
    rows, events = table(spec), Counter()
    hot = np.arange(100)
    rng = np.random.default_rng(0)
    for step in range(200):
        push(rows, hot, events)
        push(rows, rng.integers(10**6, 10**12, 300), events)  # a stream of ids seen once
        assert rows.count <= 1000
    assert (rows[hot] >= 0).all(), "a hot row was evicted"
    assert np.allclose(rows.rows(hot), initial_rows(spec, hot) - 200)
    assert events["evicted"] > 0 and events["admitted"] - events["evicted"] == rows.count
    assert (rows[rows.ids] == np.arange(rows.count)).all()  # the index agrees with the compacted rows


def test_an_evicted_id_that_comes_back_starts_again():
    spec = dynamic_table("e", 2, Dynamic(budget_bytes=budget_of(16, dynamic_table("e", 2))))
    rows, events = table(spec), Counter()
    push(rows, [5], events, grad=3.0)
    for start in range(100, 400, 16):
        push(rows, np.arange(start, start + 16), events)
    assert rows[np.array([5])][0] == -1
    push(rows, [5], events, grad=1.0)
    assert np.allclose(rows.rows(np.array([5])), initial_rows(spec, np.array([5])) - 1)


def test_a_copy_holds_the_same_rows_in_the_same_slots_and_goes_on_the_same():
    spec = dynamic_table("e", 2, Dynamic(admit_after=2, budget_bytes=budget_of(64, dynamic_table("e", 2,
                                                                                                Dynamic(admit_after=2)))))
    rows, events = table(spec, make_optimizer("adagrad", 0.1)), Counter()
    rng = np.random.default_rng(3)
    for _ in range(20):
        push(rows, rng.integers(0, 200, 40), events)
    replica, replica_events = copy.deepcopy(rows), Counter(events)
    for _ in range(20):
        ids = rng.integers(0, 200, 40)
        push(rows, ids, events)
        push(replica, ids, replica_events)
    assert (replica.ids == rows.ids).all() and (replica.values == rows.values).all()
    assert replica_events == events


def test_rows_move_by_id_to_another_placement_and_back_to_a_checkpoint(tmp_path):
    spec = dynamic_table("e", 3, Dynamic())
    specs = [spec, ParamSpec("w", (4,))]
    optimizers = {0: SGD, 1: SGD}
    from hpcreduce.ps.layout import Layout
    layout = Layout(specs, {0: 0, 1: 1}, [2])
    states = ShardState.create_many(layout, [0, 1], {"w": np.zeros(4, np.float32)}, optimizers)
    rng = np.random.default_rng(2)
    ids = np.unique(rng.integers(-2**40, 2**40, 500))
    owners = layout.placement.row_owners(0, ids)
    for state in states:
        mine = ids[owners == state.shard]
        state.tables[0].admit(mine, np.zeros((len(mine), 3), np.float32), state.row_events)
        state.tables[0].values[:] += 1.5
    three = place(specs, [0, 1, 2])
    moved = {key: [] for key in three.shards}
    for state in states:
        for key, fragments in cut(state, three).items():
            moved[key] += fragments
    tables = {key: assemble(key, specs, three, moved[key], optimizers, 1)[0] for key in three.shards}
    assert sum(t.count for t in tables.values()) == len(ids)
    for key, rows in tables.items():
        assert (three.row_owners(0, rows.ids) == key).all()
        assert np.allclose(rows.rows(rows.ids), initial_rows(spec, rows.ids) + 1.5)
    path = shard_checkpoints.save_shard(str(tmp_path), 3, states[0], [0, 1], False, identity={})
    loaded = shard_checkpoints._load(path, specs, optimizers)
    assert (np.sort(loaded.tables[0].ids) == np.sort(states[0].tables[0].ids)).all()
    assert loaded.row_events == states[0].row_events
    fixed = [ParamSpec("e", (1 << 10, 3), sparse=True), specs[1]]
    with pytest.raises(CheckpointMismatchError, match="saved dynamic and this run declares it fixed"):
        shard_checkpoints._load(path, fixed, optimizers)


def test_declarations_that_cannot_work_are_named():
    assert "must be sparse with shape (0, *row_shape)" in ParamSpec("e", (8, 2), sparse=True,
                                                                    dynamic=Dynamic()).problem()
    assert "admit_after must be a whole number >= 1" in dynamic_table("e", 2, Dynamic(admit_after=-1)).problem()
    assert "admit_after must be at most 65535" in dynamic_table("e", 2, Dynamic(admit_after=65536)).problem()
    assert dynamic_table("e", 2, Dynamic(admit_after=65535)).problem() is None
    assert "eviction must be one of lru, lfu" in dynamic_table("e", 2, Dynamic(eviction="fifo")).problem()
    assert "admit_probability must be in (0, 1]" in dynamic_table("e", 2, Dynamic(admit_probability=0)).problem()


def test_dynamic_tables_on_real_servers_values_admission_and_bad_input():
    from mpi_run import mpirun
    result = mpirun(4, "ps_dynamic.py", timeout=180)
    assert result.returncode == 0, result
    assert "ps dynamic: all checks passed" in result.output and "Traceback" not in result.output, result

