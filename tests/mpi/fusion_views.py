"""Fusion without copies (collectives/buckets.py) on any N: the same bits as the copying path.

1. GradientBuckets over mixed dtypes and shapes, cut into several buckets: allreduce_many
   in place over the views gives, for every op and algorithm, exactly the bits of
   allreduce_many over copies; the results are the views, and no fusion buffer was used.
2. Views passed out of order, or only some of them, fall back to copying and stay right; a
   call that repeats the last one reuses its plan with the same bits, a changed one is replanned.
3. hpcreduce.torch.bucket_gradients (when torch is installed): gradients become views of
   bucket storage, allreduce_gradients gives the same bits as without buckets, and a
   gradient replaced by zero_grad(set_to_none=True) and backward is put back in its view.
Every rank checks; failures are gathered and printed by rank 0.
"""
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.collectives.buckets import GradientBuckets, bucket_region
from hpcreduce.collectives.fusion import REPEATED
from hpcreduce.collectives.ops import OPS
from hpcreduce.collectives.workspace import workspace
from hpcreduce.runtime.context import resolve
from mpi_checks import sample

context = hpcreduce.init()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
failures = []
LAYOUT = [((3, 4), "float32"), ((7,), "float64"), ((5,), "float32"), ((2, 3, 2), "int64"), ((1,), "float32"),
          ((0,), "float32"), ((size + 1,), "float64"), ((1000,), "float32")]
THRESHOLD = 128  # bytes: several buckets per dtype, and the 4000-byte array alone


def check(condition, message):
    if not condition:
        failures.append(f"rank {rank}: {message}")


def arrays_for(op, seed, whole=False):
    """Inputs of LAYOUT; ``whole``: whole numbers, so sums are exact in any order (any bucketing)."""
    arrays = [sample(np.dtype(dtype), op, int(np.prod(shape)), seed=seed + i).reshape(shape)
              for i, (shape, dtype) in enumerate(LAYOUT)]
    return [np.round(a) if whole else a for a in arrays]


def check_views_match_copies():
    for op in OPS:
        for algorithm in ("auto", "ring", "recursive_doubling", "native"):
            inputs = arrays_for(op, seed=100 * rank + len(op))
            copied = hpcreduce.allreduce_many(inputs, op, algorithm=algorithm, threshold_bytes=THRESHOLD)
            buckets = GradientBuckets(inputs, threshold_bytes=THRESHOLD)
            views = buckets.load(inputs)
            check(all(bucket_region(views, [i]) is not None for i in range(len(views)) if views[i].size),
                  "a view is not recognised as bucket storage")
            got = hpcreduce.allreduce_many(views, op, algorithm=algorithm, inplace=True, threshold_bytes=THRESHOLD)
            check(all(g is v for g, v in zip(got, views)), f"{op} {algorithm}: results are not the views")
            for i, (want, have) in enumerate(zip(copied, views)):
                check(want.dtype == have.dtype and want.shape == have.shape and want.tobytes() == have.tobytes(),
                      f"{op} {algorithm}: array {i} differs from the copying path")
    # Where a fusion buffer is used it shows in the context's workspace (native needs no other scratch).
    for private, bucketed in ((world.Dup(), True), (world.Dup(), False)):
        inputs = arrays_for("sum", seed=rank)
        passed = GradientBuckets(inputs).load(inputs) if bucketed else inputs
        hpcreduce.allreduce_many(passed, "sum", algorithm="native", comm=private, inplace=True)
        used = workspace(resolve(private).cache, "host").nbytes()
        check((used == 0) == bucketed, f"bucketed={bucketed}: {used} bytes of fusion workspace")


def check_out_of_order_views_fall_back():
    inputs = arrays_for("sum", seed=7 * rank, whole=True)
    want = hpcreduce.allreduce_many(inputs, "sum", threshold_bytes=THRESHOLD)
    views = GradientBuckets(inputs, threshold_bytes=THRESHOLD).load(inputs)
    order = list(reversed(range(len(views))))
    hpcreduce.allreduce_many([views[i] for i in order], "sum", inplace=True, threshold_bytes=THRESHOLD)
    check(all(want[i].tobytes() == views[i].tobytes() for i in order), "reversed views: wrong result")
    again = GradientBuckets(inputs).load(inputs)  # the default threshold: one bucket per dtype
    hpcreduce.allreduce_many(again[::2], "sum", inplace=True)
    check(all(want[i].tobytes() == again[i].tobytes() for i in range(0, len(again), 2)),
          "every other view: wrong result")
    check(all(inputs[i].tobytes() == again[i].tobytes() for i in range(1, len(again), 2)),
          "a view that was not passed changed")


def check_repeated_calls():
    """A call that repeats the last one (the same arrays) reuses its plan and gives the same bits;
    a kept array reshaped in place, or a new list, is planned again and stays right."""
    inputs = arrays_for("sum", seed=3 * rank, whole=True)
    want = hpcreduce.allreduce_many(inputs, "sum", threshold_bytes=THRESHOLD)
    buckets = GradientBuckets(inputs, threshold_bytes=THRESHOLD)
    views = buckets.views
    kept = []
    for attempt in range(3):
        buckets.load(inputs)
        hpcreduce.allreduce_many(views, "sum", inplace=True, threshold_bytes=THRESHOLD)
        kept.append(context.cache[REPEATED])
        check(all(w.tobytes() == v.tobytes() for w, v in zip(want, views)), f"repeated call {attempt}: wrong")
    check(kept[1] is kept[0] and kept[2] is kept[0], "a repeated call did not reuse its plan")
    copies = [hpcreduce.allreduce_many(inputs, "sum", threshold_bytes=THRESHOLD) for _ in range(2)]
    check(all(a is not b and a.tobytes() == b.tobytes() == w.tobytes() for a, b, w in zip(*copies, want)),
          "repeated copying calls: results shared or wrong")
    buckets.load(inputs)
    views[0].shape = (views[0].size,)
    hpcreduce.allreduce_many(views, "sum", inplace=True, threshold_bytes=THRESHOLD)
    check(views[0].tobytes() == want[0].tobytes() and context.cache[REPEATED] is not kept[0],
          "a kept view reshaped in place: not planned again, or wrong")


def check_torch_bucket_views():
    try:
        import torch
    except ImportError:
        return "skipped (no torch)"
    import hpcreduce.torch as hpt

    def model_and_grads(bucketed, set_to_none):
        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
        if bucketed:
            hpt.bucket_gradients(model)
        for step in range(2):
            model.zero_grad(set_to_none=set_to_none)
            torch.manual_seed(10 * rank + step)
            model(torch.randn(8, 6)).pow(2).sum().backward()
            hpt.allreduce_gradients(model)
        return model, [p.grad.detach().clone().numpy() for p in model.parameters()]

    _, plain = model_and_grads(False, False)
    for set_to_none in (False, True):
        model, bucketed = model_and_grads(True, set_to_none)
        check(all(a.tobytes() == b.tobytes() for a, b in zip(plain, bucketed)),
              f"torch bucket views (set_to_none={set_to_none}) differ from the plain path")
        views = [p.grad.detach().numpy() for p in model.parameters()]
        check(all(bucket_region(views, [i]) is not None for i in range(len(views))),
              f"torch gradients are not bucket views after allreduce_gradients (set_to_none={set_to_none})")
    return "ok"


check_views_match_copies()
check_out_of_order_views_fall_back()
check_repeated_calls()
torch_verdict = check_torch_bucket_views()
everyone = world.allgather(failures)
if rank == 0:
    flat = [line for lines in everyone for line in lines]
    print(f"fusion views N={size}: torch {torch_verdict}, {len(flat)} failures")
    for line in flat[:20]:
        print(line)
sys.exit(1 if any(everyone) else 0)
