"""Model state sharded end to end: per-element initial values, row lookup without a
whole-table index, exact sharded checksums, memory accounting, sharded output and export,
and the refusals (table rows, memory) — units here, one 4-rank MPI program, the CLI."""
import json
import math
import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcreduce.ps.footprint import node_problem, shard_bytes
from hpcreduce.ps.init import PartInit, counter_normal, owned_rows, whole_tables
from hpcreduce.ps.layout import Layout
from hpcreduce.ps.placement import place
from hpcreduce.ps.roles import table_optimizers
from hpcreduce.ps.shard_state import ShardState
from hpcreduce.ps.tables import ParamSpec, RowIndex
from hpcreduce.runtime.memory import available_bytes, peak_rss_bytes, rss_bytes
from hpcreduce.train.results import exact_float, exact_sum
from mpi_run import hpcreduce_cli, mpirun

SPECS = [ParamSpec("emb", (3000, 2), sparse=True), ParamSpec("w", (40000,)), ParamSpec("b", (3,))]


def test_owned_rows_partition_the_table_for_any_k():
    for keys in ([0], [0, 1, 2], [2, 5, 7, 9]):
        placement = place(SPECS, keys)
        owned = owned_rows(placement, 0, keys)
        together = np.sort(np.concatenate(list(owned.values())))
        assert np.array_equal(together, np.arange(3000)), keys
        for key, ids in owned.items():
            assert ids.dtype == np.int32 and np.array_equal(ids, placement.rows_on(0, key))


def test_row_index_finds_owned_rows_and_nothing_else_direct_and_bucketed():
    rng = np.random.default_rng(1)
    for rows in (5000, (1 << 22) + 4096):  # a direct index; buckets and a binary search
        ids = np.sort(rng.choice(rows, 3000, replace=False)).astype(np.int32)
        index = RowIndex(ids, rows)
        assert (index.direct is None) == (rows > 1 << 22)
        query = np.concatenate([rng.permutation(ids), rng.integers(-3, rows + 3, 2000), [2**40, -2**40]])
        expected = {int(i): p for p, i in enumerate(ids)}
        assert index[query].tolist() == [expected.get(int(q), -1) for q in query], rows
        assert RowIndex(np.empty(0, np.int32), rows)[np.array([1, 7])].tolist() == [-1, -1]
        whole = RowIndex(np.arange(rows, dtype=np.int32), rows)  # every row here: no index kept
        assert whole.direct is None and whole.starts is None, rows
        assert whole[query].tolist() == [int(q) if 0 <= q < rows else -1 for q in query], rows
        assert whole[ids].tolist() == ids.tolist(), rows


def test_part_init_equals_whole_tables_on_every_shard():
    def elements(table, flat):
        return counter_normal(3, SPECS[table].name, flat, 0.5)
    whole = {s.name: elements(t, np.arange(int(np.prod(s.shape)))).reshape(s.shape) for t, s in enumerate(SPECS)}
    layout = Layout.initial(SPECS, 5, 3)
    optimizers = table_optimizers(SPECS, "adam", 0.1)
    by_parts = ShardState.create_many(layout, [0, 1, 2], PartInit(SPECS, elements), optimizers)
    for key, state in zip([0, 1, 2], by_parts):
        sliced = ShardState.create(layout, key, whole_tables(SPECS, whole), optimizers)
        for t, table in state.tables.items():
            assert np.array_equal(table.values, sliced.tables[t].values)
            assert set(table.optimizer_state) == {"m", "v"}
    values = counter_normal(3, "w", np.arange(200000), 0.5)
    assert abs(values.mean()) < 0.01 and abs(values.std() - 0.5) < 0.01


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300),
                max_size=60), st.integers(1, 5))
def test_exact_sum_over_parts_equals_fsum(terms, parts):
    chunks = np.array_split(np.array(terms, np.float64), parts)
    assert exact_float(sum(exact_sum(chunk) for chunk in chunks)) == math.fsum(terms)


def test_footprint_counts_values_state_and_ids_and_names_sizes():
    specs = [ParamSpec("emb", (1 << 26, 1), sparse=True), ParamSpec("bias", (1,))]
    layout = Layout.initial(specs, 6, 4)
    optimizers = table_optimizers(specs, "adagrad", 0.1)
    own = shard_bytes(layout, 1, optimizers)
    assert own == (1 << 24) * (4 + 4 + 4)  # a quarter of the rows: weight, accumulator, int32 id
    nodes = ["a", "a", "b", "b", "c", "c"]
    assert node_problem(layout, optimizers, True, 0, nodes, 4 * own) is None
    problem = node_problem(layout, optimizers, True, 0, nodes, 4 * own - 1)
    assert "2 server(s) on node a" in problem and "0.75 GiB" in problem, problem
    assert node_problem(layout, optimizers, True, 4, nodes, 1) is None  # no server on node c


def test_memory_is_read_from_the_os():
    before = peak_rss_bytes()
    block = np.ones(64 << 20, np.uint8)
    assert peak_rss_bytes() >= before and peak_rss_bytes() >= 64 << 20 and rss_bytes() > 64 << 20
    assert available_bytes() > 0
    del block


def test_sharded_end_same_model_export_memory_and_unfit_refused(tmp_path):
    result = mpirun(4, "ps_sharded.py", str(tmp_path), timeout=300)
    assert result.returncode == 0 and "ps sharded: all checks passed" in result.output, result
    out = tmp_path / "whole.npz"
    exported = hpcreduce_cli("export", str(tmp_path / "model"), "--out", str(out), timeout=60)
    assert exported.returncode == 0 and "from 2 shard(s)" in exported.output, exported
    with np.load(out) as model:
        assert model["weights"].shape == (4096, 1) and model["bias"].shape == (1,)
        assert np.count_nonzero(model["weights"]) > 100
    os.unlink(tmp_path / "model" / "shard-1.npz")
    broken = hpcreduce_cli("export", str(tmp_path / "model"), "--out", str(out), timeout=60)
    assert broken.returncode == 1 and "shard-1.npz is missing" in broken.output, broken


def test_cli_refuses_bad_table_rows_and_export_input(tmp_path):
    bad = hpcreduce_cli("train", "-n", "3", "--mode", "ps", "--servers", "2", "--table-rows", "1000", timeout=60)
    assert bad.returncode == 2 and bad.output.count("--table-rows must be a power of two") == 1, bad
    mlp = hpcreduce_cli("train", "-n", "2", "--model", "mlp", "--table-rows", "1024", "--model-dir", "x", timeout=60)
    assert mlp.returncode == 2 and "--table-rows sets the hashed feature space" in mlp.output, mlp
    assert "--model-dir only applies to --mode ps" in mlp.output, mlp
    missing = hpcreduce_cli("export", "/nonexistent-hpcreduce", "--out", str(tmp_path / "x.npz"), timeout=60)
    assert missing.returncode == 2 and "is not a folder" in missing.output, missing


def test_a_ring_model_too_large_for_the_node_is_refused_on_every_rank_before_allocating():
    # each rank would hold 16 B a row (weight, Adagrad's accumulator, the gradient, its buffer): past the node's memory
    rows = 1 << (available_bytes() // 16).bit_length()
    job = hpcreduce_cli("train", "-n", "2", "--table-rows", str(rows), "--steps", "3", timeout=60)
    assert job.returncode == 1 and "Traceback" not in job.output, job
    assert job.output.count("does not fit the ranks' memory: the 2 rank(s) on node") == 2, job.output
    assert f"would hold {2 * 16 * rows / (1 << 30):.2f} GiB" in job.output and "--mode ps" in job.output, job.output


def test_a_checkpoint_of_three_shards_restores_into_two_exports_whole_and_refuses_another_model(tmp_path):
    from hpcreduce.train.ps.shard_checkpoints import foreign_problem, load_states, restore, save_shard
    from hpcreduce.train.ps.export import whole_model

    def elements(table, flat):
        return counter_normal(5, SPECS[table].name, flat)
    parameters = {s.name: {"shape": list(s.shape), "dtype": s.dtype, "sparse": s.sparse} for s in SPECS}
    whole = {s.name: elements(t, np.arange(int(np.prod(s.shape)))).reshape(s.shape) for t, s in enumerate(SPECS)}
    optimizers = table_optimizers(SPECS, "adagrad", 0.1)
    three = Layout.initial(SPECS, 5, 3)
    for state in ShardState.create_many(three, [0, 1, 2], PartInit(SPECS, elements), optimizers):
        save_shard(str(tmp_path), 4, state, [0, 1, 2], False, identity={"parameters": parameters})
    saved = load_states(str(tmp_path), 4, SPECS, optimizers)
    two = Layout.initial(SPECS, 5, 2)
    for key in (0, 1):
        restored = restore(saved, key, SPECS, two.placement, optimizers, two.slot_count, [0, 1, 2])
        for t, table in restored.tables.items():
            flat = whole[SPECS[t].name].reshape(len(whole[SPECS[t].name]), -1) if table.sparse \
                else whole[SPECS[t].name].reshape(-1)
            expected = flat[np.asarray(table.ids, np.int64)] if table.sparse \
                else flat[table.start:table.start + table.values.size]
            assert np.array_equal(table.values.reshape(expected.shape), expected), (key, t)
    exported, about = whole_model(str(tmp_path))
    assert about["step"] == 4 and len(about["shards"]) == 3
    assert all(np.array_equal(exported[name], whole[name]) for name in whole)
    bigger = {**parameters, "emb": {**parameters["emb"], "shape": [6000, 2]}}
    problem = foreign_problem(str(tmp_path), {"parameters": bigger})
    assert problem is not None and "[3000, 2]" in str(problem) and "[6000, 2]" in str(problem), problem


def test_train_with_table_rows_prints_the_largest_peak_rss_per_role(tmp_path):
    run = hpcreduce_cli("train", "-n", "3", "--mode", "ps", "--servers", "1", "--table-rows", "4096", "--steps", "3",
                        "--quiet", "--json", str(tmp_path / "run.json"), timeout=120)
    assert run.returncode == 0, run
    assert run.output.count("memory: peak RSS server") == 1 and "worker" in run.output.split("memory:")[1], run
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["config"]["table_rows"] == 4096 and result["memory"]["roles"] == ["server", "worker", "worker"]
