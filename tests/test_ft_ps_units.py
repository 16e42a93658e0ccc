"""PS fault-tolerance pieces that need no MPI: fragments, shard checkpoints, the recovery plan,
the BSP settle of a shard."""
import numpy as np
import pytest

from hpcreduce.ps import Consistency, ParamSpec
from hpcreduce.ps.engine import ShardEngine
from hpcreduce.ps.fragments import assemble, cut
from hpcreduce.ps.layout import Layout
from hpcreduce.ps.protocol import Status
from hpcreduce.ps.recovery_plan import Committed, Report, make_plan
from hpcreduce.ps.roles import table_optimizers
from hpcreduce.ps.shard_state import ShardState
from hpcreduce.train.ps import shard_checkpoints as ps_checkpoint

SPECS = [ParamSpec("big", (50_000,)), ParamSpec("small", (7, 3)), ParamSpec("emb", (3000, 2), sparse=True),
         ParamSpec("half", (40_000,), "float16")]


def shards(keys, slots=3, seed=0):
    """States of ``keys`` with random values, optimizer state and bookkeeping."""
    rng = np.random.default_rng(seed)
    layout = Layout(SPECS, {k: k for k in keys}, [10, 11, 12][:slots])
    optimizers = table_optimizers(SPECS, "adam", 0.1)
    initial = {s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in SPECS}
    states = [ShardState.create(layout, k, initial, optimizers) for k in keys]
    for state in states:
        for table in state.tables.values():
            for array in table.optimizer_state.values():
                array[...] = rng.standard_normal(array.shape)
            table.last_push[:] = rng.integers(0, 9, slots)
            table.version = int(rng.integers(1, 20))
    return layout, optimizers, initial, states


def whole(states, layout):
    """Every table and optimizer state array, assembled from ``states`` in table coordinates."""
    out = {}
    for t, spec in enumerate(SPECS):
        for name in ("values", "m", "v"):
            full = np.full(spec.shape, np.nan, dtype=np.float64)
            for state in (s for s in states if t in s.tables):
                table = state.tables[t]
                data = table.values if name == "values" else table.optimizer_state[name]
                if spec.sparse:
                    full[table.ids] = data
                else:
                    full.reshape(-1)[table.start:table.start + data.size] = data
            out[(spec.name, name)] = full
    return out


@pytest.mark.parametrize("after", [[0, 2], [1], [0, 1, 2, 3], [2, 3]])
def test_fragments_move_every_element_and_its_optimizer_state_to_the_new_placement(after):
    layout, optimizers, _, states = shards([0, 1, 2])
    target = layout.rebuilt({k: k for k in after}, [10, 11, 12]).placement
    stays = set(after) <= {0, 1, 2}
    pieces = [cut(state, target, rows_stay=stays) for state in states]
    if stays:
        assert [cut(state, target) for state in states][0].keys() == pieces[0].keys()
    rebuilt = []
    for key in after:
        tables = assemble(key, SPECS, target, [f for p in pieces for f in p.get(key, [])], optimizers, 3)
        state = ShardState.empty(key, tables, 3)
        rebuilt.append(state)
        for t, table in tables.items():
            old = np.array([s.tables[t].last_push for s in states if t in s.tables])
            if not SPECS[t].sparse or len(table.ids):
                assert (old.min(axis=0) <= table.last_push).all() and (table.last_push <= old.max(axis=0)).all()
    before, now = whole(states, layout), whole(rebuilt, layout.rebuilt({k: k for k in after}, [10]))
    for name in before:
        assert not np.isnan(now[name]).any(), f"{name} not covered"
        assert np.array_equal(before[name], now[name]), name
    owners = target.row_owners(2, np.arange(3000))
    for state in rebuilt:
        assert np.array_equal(state.tables[2].ids, np.flatnonzero(owners == state.shard))


def test_shard_checkpoints_are_complete_only_when_every_shard_wrote_them_and_restore_any_placement(tmp_path):
    layout, optimizers, _, states = shards([0, 1, 2])
    for state in states:
        state.applied[:] = [5, 6, 7]
        ps_checkpoint.save_shard(str(tmp_path), 10, state, [0, 1, 2], bsp=True, identity={"seed": 0})
    for state in states[:2]:
        ps_checkpoint.save_shard(str(tmp_path), 15, state, [0, 1, 2], bsp=True, identity={"seed": 0})
    assert ps_checkpoint.latest_complete(str(tmp_path)) == 10, "shard 2 never wrote step 15"
    assert ps_checkpoint.latest_complete(str(tmp_path / "none")) is None
    saved = ps_checkpoint.load_states(str(tmp_path), 10, SPECS, optimizers)
    assert all((s.tables[0].last_push <= 9).all() for s in saved), "BSP: nothing of step 10 on"
    target = layout.rebuilt({0: 0, 3: 3}, [10]).placement
    restored = [ps_checkpoint.restore(saved, key, SPECS, target, optimizers, 3, counted=[key])
                for key in (0, 3)]
    assert np.array_equal(whole(restored, layout)[("big", "m")], whole(states, layout)[("big", "m")])
    assert restored[0].applied.tolist() == [5, 6, 7] and restored[1].applied.tolist() == [0, 0, 0]
    pushes = ps_checkpoint.last_pushes(saved)
    assert set(pushes) == {0, 1, 2} and np.array_equal(pushes[1][0], states[1].tables[0].last_push)


def reports(servers, workers, replicas, applied=None, checkpoint=None):
    """Reports of live servers (own key = rank id) and workers (slot, clock)."""
    out = []
    for key in servers:
        steps = (applied or {}).get(key, 4)
        out.append(Report(key, key, {key: steps}, replicas.get(key)))
    out += [Report(100 + slot, slot=slot, clock=clock) for slot, clock in workers]
    out[0].checkpoint = checkpoint
    return out


def committed(keys=(0, 1, 2), workers=3):
    layout = Layout(SPECS[:1], {k: k for k in keys}, range(len(keys), len(keys) + workers))
    return Committed(layout, len(keys))


def test_a_dead_servers_shard_is_adopted_from_its_backup_and_bsp_restarts_where_a_shard_got():
    plan = make_plan(reports([0, 2], [(0, 5), (1, 6), (2, 5)], {2: (1, 5), 0: (2, 4)}, {0: 5, 2: 4}),
                     committed(), bsp=True, now=1.0)
    assert plan.adopted == [1] and plan.holders == {0: 0, 2: 1, 1: 1} and not plan.restored
    assert plan.restart == 5 and set(plan.clocks.values()) == {5} and plan.fatal is None
    assert plan.layout(committed().layout).shard_ranks == {0: 0, 2: 1}
    asp = make_plan(reports([0, 2], [(0, 5), (1, 7)], {2: (1, 5)}), committed(workers=2), bsp=False, now=1.0)
    assert asp.restart is None and asp.clocks == {0: 5, 1: 7} and asp.resume_step == 6


def test_neighbours_dying_together_need_the_checkpoint_and_a_lone_dead_server_is_replaced_by_a_worker():
    no_checkpoint = make_plan(reports([0], [(0, 3)], {0: (2, 3)}), committed(), bsp=True, now=0.0)
    assert no_checkpoint.restored == [1] and "no complete checkpoint" in str(no_checkpoint.fatal)
    assert "give --checkpoint-dir" in no_checkpoint.fatal.render({"checkpoint_dir": "--checkpoint-dir"})
    rollback = make_plan(reports([0], [(0, 3)], {0: (2, 3)}, checkpoint=2), committed(), bsp=True, now=0.0)
    assert rollback.rollback and rollback.restart == 2 and rollback.fatal is None
    alone = make_plan([Report(1, slot=0, clock=7), Report(2, slot=1, clock=7)], committed((0,), 2),
                      bsp=False, now=0.0)
    assert alone.promoted == 0 and alone.own_keys == {0: 1} and alone.live_workers == [(1, 1)]
    assert alone.restored == [0] and alone.holders[0] == 0 and alone.next_key == 2
    nobody = make_plan([Report(0, 0, {0: 1})], committed((0,), 1), bsp=False, now=0.0)
    assert "every worker is gone" in str(nobody.fatal)


def test_bsp_settle_applies_complete_steps_and_drops_the_rest_for_recomputation():
    specs = [ParamSpec("w", (4,))]
    layout = Layout(specs, {0: 0}, [1, 2])
    state = ShardState.create(layout, 0, {"w": np.zeros(4, np.float32)}, table_optimizers(specs, "sgd", 1.0))
    engine = ShardEngine(state, table_optimizers(specs, "sgd", 1.0), Consistency("bsp"))
    for slot in (0, 1):
        assert engine.accept(slot, 0, 0, np.full(4, slot + 1, np.float32)) == Status.OK
    assert engine.accept(0, 1, 0, np.ones(4, np.float32)) == Status.OK
    assert engine.accept(0, 1, 0, np.ones(4, np.float32)) == Status.DUPLICATE
    assert engine.settle(1) == {0: 1}
    assert state.tables[0].values.tolist() == [-3.0] * 4 and state.applied_steps == 1
    assert state.tables[0].last_push.tolist() == [0, 0] and not state.pending
    assert engine.accept(0, 0, 0, np.ones(4, np.float32)) == Status.DUPLICATE
    assert engine.accept(1, 1, 0, np.ones(4, np.float32)) == Status.OK, "the dropped step is taken again"
