"""Ring training computes the same thing on 1, 2 and 3 ranks (run on 3 ranks).

Each case trains on sub-communicators of 1, 2 and 3 ranks from the same seed. Within
a run every rank must hold bitwise-identical parameters (equal checksums). Across
rank counts only the order of the float32 gradient sums changes: each sum moves by a
few ulps (float32 eps = 6e-8), so after a few steps parameters differ by ~1e-7 to
~1e-6 of their scale (measured: 1e-7 .. 2e-6). TOLERANCE = 1e-4, relative to the
largest parameter, leaves a margin of 50 or more, while one example dropped from each
share (a gradient off by ~1/B) moves parameters by 2e-2 .. 0.7 (measured).
"""
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.train import TrainConfig, train
from hpcreduce.train.models import MLP, LogisticRegression, SyntheticCTR, digits_dataset

TOLERANCE = 1e-4
hpcreduce.init()  # collective over the world: before any rank trains on a sub-communicator
world = MPI.COMM_WORLD
ctr = SyntheticCTR(0, train_examples=5000, test_examples=3000)
digits = digits_dataset(0)
CASES = [
    ("logreg adagrad", LogisticRegression(), ctr, TrainConfig(steps=6, batch=500, lr=0.2, optimizer="adagrad")),
    ("logreg adam", LogisticRegression(), ctr, TrainConfig(steps=6, batch=500, lr=0.05, optimizer="adam")),
    ("mlp momentum", MLP(), digits, TrainConfig(model="mlp", steps=8, batch=100, lr=0.1, optimizer="momentum")),
    ("mlp batch 2 (a rank idle)", MLP(), digits, TrainConfig(model="mlp", steps=3, batch=2, lr=0.1)),
]


def relative_difference(a, b):
    scale = max(float(np.abs(b[name]).max()) for name in b) or 1.0
    return max(float(np.abs(a[name] - b[name]).max()) for name in b) / scale


failures = []
for label, model, data, config in CASES:
    results = {}
    for ranks in (1, 2, 3):
        sub = world.Split(0 if world.rank < ranks else MPI.UNDEFINED, world.rank)
        if sub != MPI.COMM_NULL:
            result = train(model, data, config, comm=sub, verbose=False)
            checksums = sub.allgather(result.final.checksum)
            if len(set(checksums)) != 1:
                failures.append(f"{label}: the ranks of the {ranks}-rank run differ: {checksums}")
            shape = (result.ranks, result.worker_count, len(result.steps),
                     [len(steps) for steps in result.traffic["bytes_sent"]], result.staleness)
            expected = (ranks, ranks, config.steps, [config.steps] * ranks,
                        {"read_max": 0, "read_hist": [config.steps * ranks],
                         "lag_hist": [config.steps * ranks]})
            if shape != expected:
                failures.append(f"{label}: result of the {ranks}-rank run is {shape}, expected {expected}")
            results[ranks] = result
            sub.Free()
    if world.rank == 0:
        reference = results[1]
        for ranks in (2, 3):
            difference = relative_difference(results[ranks].params, reference.params)
            loss_gap = abs(results[ranks].final.loss - reference.final.loss)
            print(f"{label}: {ranks} ranks vs 1: largest parameter difference {difference:.1e} "
                  f"(relative), held-out loss difference {loss_gap:.1e}", flush=True)
            if not difference <= TOLERANCE or not loss_gap <= TOLERANCE:
                failures.append(f"{label}: {ranks} ranks differ from 1 rank by {difference:.2e} "
                                f"in parameters, {loss_gap:.2e} in loss (tolerance {TOLERANCE})")

for failure in failures:
    print(f"rank {world.rank}: FAIL {failure}", flush=True)
sys.exit(1 if world.allreduce(len(failures)) else 0)
