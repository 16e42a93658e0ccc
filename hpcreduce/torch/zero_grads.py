"""ZeRO-2: the reducer's buckets reduce-scattered, each rank keeping only its chunk of each.

A ``ZeroRedundancyOptimizer`` over exactly the parameters of one of our
``DistributedDataParallel`` wrappers (default hook) attaches a ``GradientShards`` to its reducer.
Each bucket is then cut into N near-equal chunks (``ring.chunk_bounds``); rank r's slices of
the parameters are the pieces of chunk r of every bucket. After backward each bucket is
reduce-scattered (``collectives.scatter_gather``, the mean) and this rank's chunk copied out;
the buckets' memory is released (allocated again at the next backward) and the
parameters' ``.grad`` set to None, so between steps a rank holds 1/N of the gradients. The
optimizer's step reads its slices' gradients from the chunks, then ``gather`` writes its updated
slices into one bucket-sized scratch buffer, allgathers it and copies every parameter out.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from ..collectives.ops import OPS
from ..collectives.ring import chunk_bounds
from ..collectives.scatter_gather import allgather, reduce_scatter
from ..runtime.context import Context, resolve
from .buckets import Bucket
from .views import array_view

Place = Tuple[int, int]
"""(bucket number, first element in the bucket's buffer) of one slice."""


class GradientShards:
    """This rank's chunk of every bucket's reduced gradient, and the bookkeeping around it."""

    def __init__(self, buckets: List[Bucket]):
        self.buckets = buckets
        self.size = 0
        self.rank = 0
        self.bounds: List[List[int]] = []
        self.chunks: List[torch.Tensor] = []
        self.reduced: Set[int] = set()  # ids of the parameters some rank had a gradient for
        self._scratch: Optional[torch.Tensor] = None

    def layout(self, rank: int, size: int) -> None:
        """Chunk bounds of every bucket among ``size`` ranks, and this rank's chunk buffers."""
        if (rank, size) == (self.rank, self.size):
            return
        self.rank, self.size = rank, size
        self.bounds = [chunk_bounds(sum(p.numel() for p in b.params), size) for b in self.buckets]
        self.chunks = [torch.zeros(bounds[rank + 1] - bounds[rank], dtype=b.flat.dtype)
                       for b, bounds in zip(self.buckets, self.bounds)]

    def owned(self, params: Sequence[torch.Tensor], rank: int, size: int) -> Tuple[List[Tuple[int, int, int]],
                                                                                   List[Place]]:
        """Rank ``rank``'s slices ``(parameter index, a, b)`` among ``size`` ranks, bucket by
        bucket, and where each lies in its bucket's buffer."""
        self.layout(rank, size)
        index = {id(p): i for i, p in enumerate(params)}
        slices, places = [], []
        for number, (bucket, bounds) in enumerate(zip(self.buckets, self.bounds)):
            begin, end, offset = bounds[rank], bounds[rank + 1], 0
            for param in bucket.params:
                a, b = max(begin, offset), min(end, offset + param.numel())
                if a < b:
                    slices.append((index[id(param)], a - offset, b - offset))
                    places.append((number, a))
                offset += param.numel()
        return slices, places

    def gradient(self, place: Place, length: int) -> torch.Tensor:
        """The reduced gradient of the slice at ``place`` (a view of this rank's chunk)."""
        number, begin = place
        start = begin - self.bounds[number][self.rank]
        return self.chunks[number][start:start + length]

    def reduce(self, context: Context, bucket: Bucket, check: bool) -> bool:
        """Reduce-scatter ``bucket`` (the mean) and copy this rank's chunk out; whether the
        chunk may hold only finite values (True without ``check``)."""
        self.layout(context.rank, context.size)
        bounds = self.bounds[bucket.index]
        view, _ = array_view(bucket.flat)
        reduce_scatter(context, view, bounds, OPS["mean"])
        chunk = self.chunks[bucket.index]
        chunk.copy_(bucket.flat[bounds[self.rank]:bounds[self.rank + 1]])
        return not check or math.isfinite(float(chunk.sum(dtype=torch.float64)))

    def nonfinite(self, bucket: Bucket) -> List[torch.nn.Parameter]:
        """The parameters whose piece of this rank's chunk of ``bucket`` holds a NaN or an Inf."""
        bounds, chunk, offset, bad = self.bounds[bucket.index], self.chunks[bucket.index], 0, []
        begin, end = bounds[self.rank], bounds[self.rank + 1]
        for param in bucket.params:
            a, b = max(begin, offset), min(end, offset + param.numel())
            if a < b and not bool(torch.isfinite(chunk[a - begin:b - begin]).all()):
                bad.append(param)
            offset += param.numel()
        return bad

    def release(self, reduced: Set[int]) -> None:
        """After a reduction: the buckets' memory freed, the parameters without ``.grad``."""
        self.reduced = reduced
        for bucket in self.buckets:
            for param in bucket.params:
                param.grad = None
            bucket.flat = bucket.flat.new_empty(0)
            bucket.views[:] = [bucket.flat] * len(bucket.views)

    def gather(self, context: Context, places: Sequence[Place], shards: Sequence[torch.Tensor]) -> None:
        """Every rank's updated slices into every rank's parameters, bucket by bucket (one
        allgather each through a scratch buffer of the largest bucket's size)."""
        largest = max(bounds[-1] for bounds in self.bounds)
        if self._scratch is None or self._scratch.numel() < largest:
            self._scratch = torch.empty(largest, dtype=self.buckets[0].flat.dtype)
        by_bucket: Dict[int, List[int]] = {}
        for position, (number, _) in enumerate(places):
            by_bucket.setdefault(number, []).append(position)
        for number, (bucket, bounds) in enumerate(zip(self.buckets, self.bounds)):
            flat = self._scratch[:bounds[-1]]
            for position in by_bucket.get(number, []):
                begin = places[position][1]
                flat[begin:begin + shards[position].numel()].copy_(shards[position])
            view, _ = array_view(flat)
            allgather(context, view, bounds)
            offset = 0
            with torch.no_grad():
                for param in bucket.params:
                    param.view(-1).copy_(flat[offset:offset + param.numel()])
                    offset += param.numel()

    def restore(self) -> bool:
        """A backward's first gradient: the buckets' memory back (its values rewritten by it);
        whether any was (the hooks' ``GradBucket``s then need the new buffers)."""
        restored = False
        for bucket in self.buckets:
            if bucket.flat.numel() == 0 and bucket.params:
                bucket.flat = bucket.flat.new_empty(sum(p.numel() for p in bucket.params))
                offset, views = 0, []
                for param in bucket.params:
                    views.append(bucket.flat[offset:offset + param.numel()].view_as(param))
                    offset += param.numel()
                bucket.views[:] = views
                restored = True
        return restored


def reducer_of(params: Sequence[torch.Tensor], context: Context) -> Optional[Any]:
    """The live reducer of one ``DistributedDataParallel`` over exactly ``params`` (CPU buckets,
    the default hook, ``context``'s ranks, no other ZeRO-2 attached), or None."""
    from .hooks.default import allreduce_hook
    from .reducer import LIVE
    wanted = {id(p) for p in params}
    for reducer in list(LIVE):
        if set(reducer.where) == wanted and len(wanted) == len(params) and reducer.shards is None \
                and reducer.hook is allreduce_hook and all(b.flat.device.type == "cpu" for b in reducer.buckets) \
                and resolve(reducer.comm_arg).comm == context.comm:
            return reducer
    return None


def attach(optimizer: object, reducer: Any) -> GradientShards:
    """Make ``reducer`` reduce-scatter for ``optimizer`` for as long as the optimizer lives."""
    shards = GradientShards(reducer.buckets)
    reducer.shards = shards
    weakref.finalize(optimizer, _detach, weakref.ref(reducer), shards)
    return shards


def _detach(reducer_ref: Any, shards: GradientShards) -> None:
    reducer = reducer_ref()
    if reducer is not None and reducer.shards is shards:
        reducer.shards = None
        if shards.restore():
            reducer.new_buffers()
