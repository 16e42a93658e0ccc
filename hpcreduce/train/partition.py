"""Which examples a step trains on, and which worker computes which of them.

The one place data is partitioned, for ring and parameter-server workers alike.
Step ``t`` (from 0) trains on positions ``[t*B, (t+1)*B)`` of an endless stream
made of one seeded permutation of the training set per epoch, so every rank
computes the same global batch without communicating, and every epoch is
reshuffled. A worker's share is a contiguous slice of the global batch, shares
differing by at most one example: the batch is covered exactly once for any
number of workers. Everything is a pure function of (step, worker, workers), so
a step can be re-split after workers fail or join.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Tuple

import numpy as np

PARTITION_STREAM = 0x5EED_0001


@lru_cache(maxsize=4)
def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The (read-only) order in which epoch ``epoch`` visits the training examples."""
    order = np.random.default_rng([seed, PARTITION_STREAM, epoch]).permutation(num_examples)
    order.setflags(write=False)
    return order


def global_batch(step: int, batch: int, num_examples: int, seed: int) -> np.ndarray:
    """Indices of the ``batch`` examples of step ``step`` (from 0); a batch may span epochs."""
    if step < 0 or batch < 1 or num_examples < 1:
        raise ValueError(f"need step >= 0, batch >= 1 and examples >= 1, "
                         f"got {step}, {batch} and {num_examples}")
    position, end = step * batch, (step + 1) * batch
    pieces = []
    while position < end:
        epoch, offset = divmod(position, num_examples)
        take = min(end - position, num_examples - offset)
        pieces.append(epoch_order(num_examples, seed, epoch)[offset:offset + take])
        position += take
    return np.concatenate(pieces)


def share_bounds(count: int, worker: int, workers: int) -> Tuple[int, int]:
    """``[start, stop)`` of worker ``worker``'s slice of ``count`` items split over ``workers``:
    the first ``count % workers`` workers get one item more."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker must be in [0, {workers}), got {worker}")
    base, extra = divmod(count, workers)
    start = worker * base + min(worker, extra)
    return start, start + base + (worker < extra)


def worker_share(indices: np.ndarray, worker: int, workers: int) -> np.ndarray:
    """Worker ``worker``'s contiguous share of ``indices`` (a global batch)."""
    start, stop = share_bounds(len(indices), worker, workers)
    return indices[start:stop]


def worker_batch(step: int, worker: int, workers: int, *, batch: int, num_examples: int,
                 seed: int) -> np.ndarray:
    """Example indices worker ``worker`` of ``workers`` computes at step ``step``."""
    return worker_share(global_batch(step, batch, num_examples, seed), worker, workers)
