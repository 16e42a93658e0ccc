"""Parameter-server pieces that need no MPI: placement, layout, settings, state, row sums."""
import pickle
from collections import Counter

import numpy as np
import pytest

from hpcreduce.ps import Consistency, ParamSpec, PSConfigError
from hpcreduce.ps.inbox import SMALL_CHECK, all_finite
from hpcreduce.ps.layout import Layout
from hpcreduce.ps.optimizers import SGD
from hpcreduce.ps.placement import SPLIT_BYTES, place
from hpcreduce.ps.roles import table_optimizers
from hpcreduce.ps.shard_state import ShardState
from hpcreduce.ps.tables import numel
from hpcreduce.ps.updates import sum_rows


def random_specs(rng, count):
    specs = []
    for i in range(count):
        kind = rng.integers(4)
        if kind == 0:
            shape = ()                                              # a scalar
        elif kind == 1:
            shape = (int(rng.integers(0, 40)),)                     # tiny, maybe empty
        elif kind == 2:
            shape = (int(rng.integers(1, 300)), int(rng.integers(1, 300)))   # up to ~350 KiB
        else:
            shape = (int(rng.integers(50_000, 400_000)),)            # large: split
        dtype = ("float32", "float64", "float16")[int(rng.integers(3))]
        specs.append(ParamSpec(f"t{i}", shape, dtype))
    specs.append(ParamSpec("rows", (int(rng.integers(1, 5000)), 3), "float32", sparse=True))
    return specs


@pytest.mark.parametrize("seed", range(12))
def test_dense_pieces_cover_every_element_once_and_balance_bytes(seed):
    rng = np.random.default_rng(seed)
    specs = random_specs(rng, int(rng.integers(1, 12)))
    for shards in (1, 2, 3, 5, 8, 13):
        placement = place(specs, list(range(shards)))
        held = np.zeros(shards, dtype=np.int64)
        for t, spec in enumerate(specs):
            if spec.sparse:
                assert t not in placement.pieces
                continue
            covered = np.zeros(numel(spec), dtype=np.int64)
            for piece in placement.pieces[t]:
                assert 0 <= piece.start < piece.stop <= numel(spec) and piece.table == t
                covered[piece.start:piece.stop] += 1
                held[piece.shard] += piece.size * np.dtype(spec.dtype).itemsize
            assert (covered == 1).all(), (spec, shards)
            if numel(spec) * np.dtype(spec.dtype).itemsize < SPLIT_BYTES:
                assert len(placement.pieces[t]) <= 1, "small tables are never cut"
        fair = held.sum() / shards
        assert np.abs(held - fair).max() <= SPLIT_BYTES, (held, fair)
        assert sorted(p for s in range(shards) for p in placement.pieces_on(s)) == \
            sorted(p for pieces in placement.pieces.values() for p in pieces)


def test_large_tensor_spreads_over_shards_and_small_ones_pack_together():
    specs = [ParamSpec("big", (1 << 20,)), ParamSpec("a", (10,)), ParamSpec("b", (3, 3))]
    placement = place(specs, [0, 1, 2, 3])
    assert [p.shard for p in placement.pieces[0]] == [0, 1, 2, 3]
    assert {p.shard for p in placement.pieces[1] + placement.pieces[2]} == {3}


@pytest.mark.parametrize("shards", [1, 2, 3, 7])
def test_sparse_rows_have_exactly_one_owner_and_spread_evenly(shards):
    specs = [ParamSpec("emb", (20_000, 4), sparse=True), ParamSpec("w", (5,))]
    placement = place(specs, list(range(shards)))
    owned = [placement.rows_on(0, s) for s in range(shards)]
    together = np.sort(np.concatenate(owned))
    assert np.array_equal(together, np.arange(20_000))
    assert all(np.array_equal(placement.row_owners(0, ids), np.full(len(ids), s))
               for s, ids in enumerate(owned))
    sizes = np.array([len(ids) for ids in owned])
    assert sizes.min() > 0.8 * 20_000 / shards


def test_recomputed_placement_only_moves_what_the_lost_shard_held():
    specs = [ParamSpec("emb", (50_000, 2), sparse=True), ParamSpec("big", (300_000,)),
             ParamSpec("bias", (7,))]
    before = place(specs, [0, 1, 2, 3])
    after = place(specs, [0, 1, 3])                 # shard 2 died; keys stay the same
    ids = np.arange(50_000)
    old, new = before.row_owners(0, ids), after.row_owners(0, ids)
    assert np.array_equal(old[old != 2], new[old != 2]), "rows of live shards stay put"
    assert set(np.unique(new)) == {0, 1, 3}
    for t in (1, 2):
        covered = np.zeros(numel(specs[t]), dtype=np.int64)
        for piece in after.pieces[t]:
            assert piece.shard in (0, 1, 3)
            covered[piece.start:piece.stop] += 1
        assert (covered == 1).all()


def test_layout_roles_and_bad_server_counts():
    specs = [ParamSpec("w", (4,))]
    layout = Layout.initial(specs, size=5, servers=2)
    assert [layout.is_server(r) for r in range(5)] == [True, True, False, False, False]
    assert [layout.slot_of(r) for r in range(5)] == [-1, -1, 0, 1, 2]
    moved = layout.rebuilt({0: 0, 1: 3}, [1, 2, 4])
    assert moved.shard_ranks == {0: 0, 1: 3} and moved.slot_of(4) == 2
    for servers in (0, -1, 5, 6):
        with pytest.raises(PSConfigError, match="servers K needs 1 <= K < ranks") as refused:
            Layout.initial(specs, size=5, servers=servers)
        assert refused.value.render({"servers": "--servers"}).startswith("--servers K needs 1 <= K < ranks")


def test_consistency_settings():
    assert Consistency("bsp").bound == 0 and Consistency("ssp", 3).bound == 3
    assert Consistency("asp").bound is None and Consistency("asp").may_read(100, 0)
    ssp = Consistency("ssp", 2)
    assert ssp.may_read(5, 3) and not ssp.may_read(6, 3)
    for kind, staleness, fragment in (("bsp", 2, "only applies to ssp"), ("ssp", -1, ">= 0"),
                                      ("sync", 0, "must be one of")):
        with pytest.raises(PSConfigError, match=fragment):
            Consistency(kind, staleness)
    with pytest.raises(PSConfigError, match="unknown tables"):
        table_optimizers([ParamSpec("w", (2,))], "sgd", 0.1, {"v": 0.2})
    with pytest.raises(PSConfigError, match="unknown optimizer"):
        table_optimizers([ParamSpec("w", (2,))], "lbfgs", 0.1)
    optimizers = table_optimizers([ParamSpec("w", (2,)), ParamSpec("v", (2,))], "adam", 0.1, {"v": 0.5})
    assert (optimizers[0].lr, optimizers[1].lr, optimizers[1].name) == (0.1, 0.5, "adam")


def test_shard_state_holds_its_share_and_survives_pickling():
    specs = [ParamSpec("emb", (100, 3), sparse=True), ParamSpec("big", (40_000,))]
    layout = Layout.initial(specs, size=4, servers=2)
    initial = {"emb": np.arange(300, dtype=np.float32).reshape(100, 3),
               "big": np.arange(40_000, dtype=np.float32)}
    optimizers = table_optimizers(specs, "adam", 0.1)
    states = [ShardState.create(layout, k, initial, optimizers) for k in (0, 1)]
    assert sum(s.tables[0].values.shape[0] for s in states) == 100
    for state in states:
        table = state.tables[0]
        assert np.array_equal(table.values, initial["emb"][table.ids])
        assert set(table.optimizer_state) == {"m", "v"}
        big = state.tables[1]
        assert np.array_equal(big.values, initial["big"][big.start:big.start + big.values.size])
    copy = pickle.loads(pickle.dumps(states[0].snapshot()))
    assert np.array_equal(copy.tables[1].values, states[0].tables[1].values)
    assert copy.tables[1].values is not states[0].tables[1].values


def test_row_sums_and_ownership():
    ids, grads = sum_rows([(np.array([1, 4]), np.array([[1.0], [2.0]])),
                           (np.array([0, 4]), np.array([[3.0], [5.0]]))])
    assert ids.tolist() == [0, 1, 4] and grads[:, 0].tolist() == [3.0, 1.0, 7.0]
    specs = [ParamSpec("emb", (50, 1), sparse=True)]
    layout = Layout.initial(specs, size=3, servers=2)
    state = ShardState.create(layout, 0, {"emb": np.zeros((50, 1), np.float32)},
                              table_optimizers(specs, "sgd", 0.1))
    store = state.tables[0]  # a fixed table's row store: by id
    mine = store.ids
    assert store.foreign(mine[::2]) is None and np.array_equal(store.rows(mine[::2]), np.zeros((len(mine[::2]), 1)))
    theirs = np.setdiff1d(np.arange(50), mine)
    assert store.foreign(np.array([mine[0], theirs[0]])) == theirs[0]
    store.apply(mine[:2], np.ones((2, 1), np.float32), SGD(0.5), 1, Counter())
    assert store.rows(mine[:3])[:, 0].tolist() == [-0.5, -0.5, 0.0] and store.version == 1


def test_nonfinite_gradients_are_spotted():
    assert all_finite(np.ones((3, 4), np.float32)) and all_finite(np.full(4, 1e30, np.float32))
    assert all_finite(np.ones(3, np.float16)) and all_finite(np.zeros(0))
    large = SMALL_CHECK + 1  # the BLAS path; its overflow falls back to the elementwise check
    assert all_finite(np.full(large, 1e30, np.float32)) and all_finite(np.ones(large))
    for bad in (np.nan, np.inf, -np.inf):
        for dtype in (np.float16, np.float32, np.float64):
            for size in (1000, large):
                values = np.ones(size, dtype)
                values[777] = bad
                assert not all_finite(values), (bad, dtype, size)


def test_key_cache_names_a_repeated_list_and_a_server_only_recalls_what_it_was_sent():
    from hpcreduce.ps.key_cache import KnownKeys, SentKeys
    sent, known = SentKeys(), KnownKeys()
    ids = np.array([3, 9, 12])
    number, cached = sent.number(1, 0, ids)
    assert not cached
    known.remember(slot=0, table=0, number=number, ids=ids)
    assert sent.number(1, 0, ids.copy()) == (number, True), "the same list again: its number"
    assert sent.number(2, 0, ids)[1] is False, "another server has not seen it"
    assert sent.number(1, 1, ids)[1] is False, "nor another table"
    other, cached = sent.number(1, 0, np.array([3, 9]))
    assert not cached and other != number, "a different list gets a new number"
    assert np.array_equal(known.recall(0, 0, number), ids)
    assert known.recall(0, 0, other) is None and known.recall(1, 0, number) is None
    sent.forget(1, 0)
    assert sent.number(1, 0, np.array([3, 9]))[1] is False, "forgotten: sent whole again"


def test_wire_dtype_only_narrows_floats():
    from hpcreduce.ps.protocol import wire_dtype
    assert wire_dtype("float32", np.float16) == np.float16
    assert wire_dtype("float64", np.float16) == np.float16
    assert wire_dtype("float32") == np.float32
    assert wire_dtype("float16", np.float16) == np.float16
    assert wire_dtype("float16", np.float32) == np.float16, "never wider than stored"
    assert wire_dtype("int64", np.float16) == np.int64


def test_load_summary_reports_per_server_steps_and_imbalance():
    from hpcreduce.ps.stats import RequestLoad, load_summary
    busy, idle = RequestLoad(), RequestLoad()
    for step in range(3):
        busy.request(step, 100)
        busy.request(step, 0)
        busy.reply(step, 50)
        idle.request(step, 0)
    summary = load_summary({0: busy.per_step(3), 2: idle.per_step(3)})
    header = RequestLoad.HEADER_BYTES
    assert summary["server_ranks"] == [0, 2]
    assert summary["requests_per_step"] == [[2, 2, 2], [1, 1, 1]]
    assert summary["bytes_per_step"][0] == [150 + 3 * header] * 3
    assert summary["requests_max_mean"] == pytest.approx(2 / 1.5, abs=1e-4)
    assert summary["bytes_max_mean"] == pytest.approx((150 + 3 * header) / ((150 + 4 * header) / 2), abs=1e-4)
    assert load_summary({0: RequestLoad().per_step(2)})["requests_max_mean"] == 1.0, "no load: balanced"
