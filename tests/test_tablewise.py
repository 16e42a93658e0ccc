"""Table-wise sharding's pieces in one process: the tables' placement, the owner's pooled
backward (``kernels.pool.pooled_rows``) against the row-wise path's sums, bit for bit, and rows
made on first touch against rows made at start."""
import numpy as np
import torch
from mpi4py import MPI

from hpcreduce.ps import ParamSpec
from hpcreduce.ps.colocated.shards import default_init
from hpcreduce.ps.colocated.tablewise import TableWiseTables, owners
from hpcreduce.ps.colocated.tablewise_rows import FirstTouch, per_row
from hpcreduce.ps.kernels.pool import pooled_rows
from hpcreduce.ps.kernels.rows import pooled_grad
from hpcreduce.ps.updates import sum_rows
from hpcreduce.torch.embedding_configs import EmbeddingBagConfig
from hpcreduce.torch.layouts import TableInit


def test_tables_go_largest_first_to_the_least_loaded_rank():
    specs = [ParamSpec(f"t{i}", (rows, 4), sparse=True) for i, rows in enumerate([10, 40, 30, 20, 10])]
    assert owners(specs, 2).tolist() == [0, 0, 1, 1, 0]  # 40 -> 0, 30 -> 1, 20 -> 1, then t0 -> 0, t4 -> 0 (a tie)
    assert owners(specs, 1).tolist() == [0] * 5


def test_pooled_rows_makes_the_row_wise_sums():
    rng = np.random.default_rng(0)
    senders, width, scale = 3, 5, np.float32(1 / 3)
    ids, bag_of, factors, grads, starts, bags = [], [], [], [], [0], 0
    expected = []
    for r in range(senders):
        lengths = rng.integers(0, 4, 7)
        sender_ids = rng.integers(0, 20, lengths.sum())
        sender_bags = np.repeat(np.arange(len(lengths)), lengths)
        sender_factors = rng.random(len(sender_ids)).astype(np.float32)
        sender_grads = rng.normal(size=(len(lengths), width)).astype(np.float32)
        unique, inverse = np.unique(sender_ids, return_inverse=True)
        rows = np.zeros((len(unique), width), np.float32)  # the trainer's pooled backward, then its scaling
        pooled_grad(rows, inverse.astype(np.int64), sender_bags, sender_grads, sender_factors)
        expected.append((unique, rows * scale))
        ids.append(sender_ids)
        bag_of.append(sender_bags + bags)
        factors.append(sender_factors)
        grads.append(sender_grads)
        bags += len(lengths)
        starts.append(starts[-1] + len(sender_ids))
    got_ids, got = pooled_rows(np.concatenate(ids), np.concatenate(bag_of), np.concatenate(factors),
                               np.concatenate(grads), np.array(starts), np.ones(senders, np.bool_), scale)
    want_ids, want = sum_rows([(i, g) for i, g in expected if len(i)])
    order = np.argsort(got_ids)
    assert np.array_equal(got_ids[order], want_ids)
    assert np.array_equal(got[order], want)
    live = np.array([True, False, True])  # a sender that sent no gradients is left out
    _, without = pooled_rows(np.concatenate(ids), np.concatenate(bag_of), np.concatenate(factors),
                             np.concatenate(grads), np.array(starts), live, scale)
    assert not np.array_equal(np.sort(without.sum(1)), np.sort(got.sum(1)))


def test_rows_made_on_first_touch_are_the_rows_made_at_start():
    specs = [ParamSpec("a", (50, 3), sparse=True), ParamSpec("b", (40, 2), sparse=True)]
    touch, init = FirstTouch(default_init(specs, 7)), default_init(specs, 7)
    rows = touch.empty("primary", 0)
    touch.make("primary", 0, np.array([5, 9, 5, 49], np.int64))
    assert np.array_equal(rows[[5, 9, 49]], init.rows(0, np.array([5, 9, 49])))
    touch.make_all()
    assert np.array_equal(rows, init.rows(0, np.arange(50))) and not touch.pending
    assert per_row(None, 0) and not per_row(init, 0)  # a PartInit says so itself
    configs = [EmbeddingBagConfig(name="c", embedding_dim=4, num_embeddings=10, feature_names=["f"]),
               EmbeddingBagConfig(name="d", embedding_dim=4, num_embeddings=10, feature_names=["g"],
                                  init_fn=torch.nn.init.normal_)]
    assert [per_row(TableInit(configs, 1), t) for t in range(2)] == [True, False]  # a generator's draws: at start


def test_table_wise_tables_made_on_first_touch_train_as_tables_made_at_start(tmp_path):
    specs = [ParamSpec("a", (300, 4), sparse=True), ParamSpec("b", (200, 8), sparse=True)]
    lazy = TableWiseTables(specs, optimizer="adagrad", lr=0.1, comm=MPI.COMM_SELF, seed=4)
    eager = TableWiseTables(specs, optimizer="adagrad", lr=0.1, comm=MPI.COMM_SELF, init=default_init(specs, 4))
    assert len(lazy.touch.pending) == 2 and not eager.touch.pending
    rng = np.random.default_rng(3)
    for _ in range(3):
        lookups = [(rng.integers(0, spec.shape[0], 20), np.full(5, 4, np.int64), None) for spec in specs]
        grads = [rng.normal(size=(5, spec.shape[1])).astype(np.float32) for spec in specs]
        pooled = []
        for tables in (lazy, eager):
            pooled.append(tables.pool_async(lookups).wait())
            tables.push_pooled_async(grads).wait()
            tables.clock()
        assert all(np.array_equal(a, b) for a, b in zip(*pooled))
    every = {spec.name: np.arange(spec.shape[0]) for spec in specs}
    got, want = lazy.pull_rows_many_async(every).wait(), eager.pull_rows_many_async(every).wait()
    assert all(np.array_equal(got[name], want[name]) for name in every)
    lazy.save_checkpoint(str(tmp_path))  # every row made, then written
    assert not lazy.touch.pending
    for t in range(2):
        with np.load(tmp_path / f"table-{t}.npz") as saved:
            assert np.array_equal(saved["values"], eager.values[t])
            assert np.array_equal(saved["state_accumulator"], eager.state[t]["accumulator"])
    lazy.release()
    eager.release()
