"""Which examples a step trains on, and which worker computes which of them.

The one place data is partitioned, for ring and parameter-server workers alike.
The training split is cut into shards (``Dataset.shard_sizes``: files of a data
directory, or fixed blocks of generated data). Step ``t`` (from 0) takes positions
``[t*B, (t+1)*B)`` of an endless stream dealt round-robin over the S shards:
position ``p`` is example ``p // S`` of shard ``p % S``'s own stream, which visits
the shard in one seeded permutation per epoch (every epoch reshuffled). The global
batch therefore depends only on (step, B, shard sizes, seed), never on the worker
count, and every rank computes it without communicating.

Worker ``w`` of ``W`` owns shards ``w, w + W, w + 2W, ...`` (``owned_shards``: dealt like
cards, so a step's consecutive positions spread evenly over the workers whatever the
batch) and computes exactly the examples its shards give the step, so it reads or
generates only its own partition; the workers' shares cover the global batch exactly
once. Everything is a pure function of (step, worker, workers), so shards are
reassigned by simply calling it with the new worker count after workers fail or join.
With more workers than shards the extra workers compute nothing.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, List, Sequence, Tuple, Union

import numpy as np

PARTITION_STREAM = 0x5EED_0001
DEFAULT_SHARDS = 64
Shards = Union[int, Sequence[int]]  # shard sizes, or a count of examples cut by ``even_shards``


@lru_cache(maxsize=1024)
def shard_order(size: int, seed: int, shard: int, epoch: int) -> np.ndarray:
    """The (read-only) order in which epoch ``epoch`` visits the ``size`` examples of ``shard``;
    a worker keeps those of its shards' current (and next) epochs: 8 bytes per example it owns."""
    order = np.random.default_rng([seed, PARTITION_STREAM, shard, epoch]).permutation(size)
    order.setflags(write=False)
    return order


@lru_cache(maxsize=16)
def even_shards(num_examples: int, count: int = DEFAULT_SHARDS) -> Tuple[int, ...]:
    """Sizes of ``count`` shards (fewer when there are fewer examples) cutting ``num_examples``
    examples into contiguous blocks differing by at most one example."""
    if num_examples < 1:
        raise ValueError(f"need at least one example, got {num_examples}")
    count = max(1, min(count, num_examples))
    return tuple(stop - start for start, stop in (share_bounds(num_examples, s, count) for s in range(count)))


@lru_cache(maxsize=16)
def _layout(sizes: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    if not sizes or min(sizes) < 1:
        raise ValueError(f"every shard needs at least one example, got sizes {list(sizes[:8])}")
    sizes_array = np.asarray(sizes, np.int64)
    firsts = np.concatenate([[0], np.cumsum(sizes_array)[:-1]])
    sizes_array.setflags(write=False)
    firsts.setflags(write=False)
    return sizes_array, firsts


def shard_layout(shards: Shards) -> Tuple[np.ndarray, np.ndarray]:
    """(sizes, first example index) of each shard; an int is a count of examples in ``even_shards``."""
    return _layout(even_shards(shards) if isinstance(shards, (int, np.integer)) else tuple(int(s) for s in shards))


def shard_examples(step: int, batch: int, shards: Shards, seed: int, shard: int) -> np.ndarray:
    """Indices (into the whole split) of the examples shard ``shard`` gives step ``step``."""
    return _shard_examples(step, batch, shard_layout(shards), seed, shard)


def _shard_examples(step: int, batch: int, layout: Tuple[np.ndarray, np.ndarray], seed: int,
                    shard: int) -> np.ndarray:
    sizes, firsts = layout
    count, size = len(sizes), int(sizes[shard])
    # stream positions p = j * count + shard in [step * batch, (step + 1) * batch)
    low, high = (-((shard - step * batch) // count), -((shard - (step + 1) * batch) // count))
    pieces, position = [], low
    while position < high:
        epoch, offset = divmod(position, size)
        take = min(high - position, size - offset)
        pieces.append(shard_order(size, seed, shard, epoch)[offset:offset + take])
        position += take
    return int(firsts[shard]) + (pieces[0] if len(pieces) == 1 else np.concatenate(pieces or [np.zeros(0, np.int64)]))


def owned_shards(worker: int, workers: int, shards: Shards) -> range:
    """The shards worker ``worker`` of ``workers`` reads: every ``workers``-th from ``worker`` (maybe none)."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker must be in [0, {workers}), got {worker}")
    return range(worker, len(shard_layout(shards)[0]), workers)


def assignment(worker_ids: Sequence[int], shards: Shards) -> List[List[Any]]:
    """``[worker id, [its shards]]`` of each worker, ``worker_ids`` in worker order: who reads
    which shards (recorded in the recovery events when workers fail or join)."""
    return [[int(identity), list(owned_shards(index, len(worker_ids), shards))]
            for index, identity in enumerate(worker_ids)]


def _check(step: int, batch: int) -> None:
    if step < 0 or batch < 1:
        raise ValueError(f"need step >= 0 and batch >= 1, got {step} and {batch}")


def worker_batch(step: int, worker: int, workers: int, *, batch: int, shards: Shards,
                 seed: int) -> np.ndarray:
    """Example indices worker ``worker`` of ``workers`` computes at step ``step``: those of its shards."""
    _check(step, batch)
    layout = shard_layout(shards)
    parts = [_shard_examples(step, batch, layout, seed, shard) for shard in owned_shards(worker, workers, shards)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def global_batch(step: int, batch: int, shards: Shards, seed: int) -> np.ndarray:
    """Indices of the ``batch`` examples of step ``step`` (from 0), shard by shard; a batch may
    span epochs. The workers' shares are a partition of it."""
    return worker_batch(step, 0, 1, batch=batch, shards=shards, seed=seed)


def share_bounds(count: int, worker: int, workers: int) -> Tuple[int, int]:
    """``[start, stop)`` of worker ``worker``'s slice of ``count`` items split over ``workers``:
    the first ``count % workers`` workers get one item more."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker must be in [0, {workers}), got {worker}")
    base, extra = divmod(count, workers)
    start = worker * base + min(worker, extra)
    return start, start + base + (worker < extra)
