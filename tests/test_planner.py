"""The one bucket planner (collectives.buckets.plan) and its callers: one process, no MPI."""
import numpy as np
import torch

from hpcreduce.collectives.buckets import GradientBuckets, plan, plan_buckets
from hpcreduce.torch import buckets as torch_buckets


def test_reverse_order_with_a_first_cap_and_a_bucket_per_key():
    sizes, keys = [4, 4, 4, 4, 8], ["a", "a", "b", "a", "a"]
    assert plan(sizes, keys, 8) == [[4], [3], [2], [1, 0]]
    assert plan(sizes, keys, 100, first_cap=4) == [[4], [3], [2], [1, 0]]
    assert plan([4] * 4, ["a"] * 4, 100, first_cap=4) == [[3], [2, 1, 0]]
    assert plan([20, 4], ["a", "a"], 8) == [[1], [0]]  # an oversized item alone


def test_forward_mixed_keeps_one_open_bucket_per_key():
    assert plan([4, 4, 4, 4], ["a", "b", "a", "b"], 8, forward=True, mixed=True) == [[0, 2], [1, 3]]
    assert plan([4, 4, 4, 4], ["a", "b", "a", "b"], 8, forward=True) == [[0], [1], [2], [3]]


def test_the_fusion_and_torch_plans_are_the_planners():
    arrays = [np.zeros(3, np.float32), np.zeros(2, np.float64), np.zeros(4, np.float32)]
    assert plan_buckets(arrays, 1 << 20) == [[0, 2], [1]]
    views = GradientBuckets(arrays).load(arrays)
    assert views[2].base is views[0].base  # one buffer for the two float32 arrays
    named = [(str(i), torch.nn.Parameter(torch.zeros(n))) for i, n in enumerate([300_000, 10, 10])]
    assert torch_buckets.plan(named, 25 << 20) == [[2, 1], [0]]  # the first bucket at most 1 MiB, as DDP
