"""Table-wise sharding's pieces in one process: the tables' placement and the owner's pooled
backward (``kernels.pool.pooled_rows``) against the row-wise path's sums, bit for bit."""
import numpy as np

from hpcreduce.ps import ParamSpec
from hpcreduce.ps.colocated.tablewise import owners
from hpcreduce.ps.kernels.pool import pooled_rows
from hpcreduce.ps.kernels.rows import pooled_grad
from hpcreduce.ps.updates import sum_rows


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
