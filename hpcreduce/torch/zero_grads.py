"""ZeRO-2: the reducer's buckets reduce-scattered, each rank keeping only its chunk of each.

A ``ZeroRedundancyOptimizer`` over exactly the parameters of one of our
``DistributedDataParallel`` wrappers (default hook) attaches a ``GradientShards`` to its reducer.
Each bucket is then cut into N near-equal chunks (``ring.chunk_bounds``); rank r's slices of
the parameters are the pieces of chunk r of every bucket. After backward each bucket is
reduce-scattered (``collectives.scatter_gather``, the mean) and this rank's chunk copied out;
the buckets' memory is released (allocated again at the next backward) and the
parameters' ``.grad`` set to None, so between steps a rank holds 1/N of the gradients. The
optimizer's step reads its slices' gradients from the chunks, then ``gather`` writes its updated
slices into a scratch buffer (the buckets together up to ``GATHER_ELEMENTS``), allgathers it and
copies the other ranks' slices into the parameters.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator, List, Optional, Sequence, Set, Tuple

import torch

from ..collectives.ops import OPS
from ..collectives.ring import chunk_bounds
from mpi4py import MPI

from ..collectives.scatter_gather import ScatterGather
from ..runtime.context import Context, resolve
from ..runtime.failures import release
from .buckets import Bucket
from .finite import may_be_finite
from .step_guard import LIVE
from .views import array_view, write_elements

GATHER_ELEMENTS = 1 << 22
"""Buckets are gathered together up to this many elements (16 MiB of float32): fewer barriers
for a small model, and a bounded shared window (two regions per rank) for a large one."""
Place = Tuple[int, int]
"""(bucket number, first element in the bucket's buffer) of one slice."""


class GradientShards:
    """This rank's chunk of every bucket's reduced gradient, and the bookkeeping around it."""

    def __init__(self, buckets: List[Bucket], outer: Callable[[], Context]):
        self.buckets = buckets
        self.outer = outer  # the reducer's context (its own duplicate), made again after a recovery
        self.size = 0
        self.rank = 0
        self.bounds: List[List[int]] = []
        self.chunks: List[torch.Tensor] = []
        self.reduced: Set[int] = set()  # ids of the parameters some rank had a gradient for
        total = sum(p.numel() for b in buckets for p in b.params)
        self._room = max(min(total, GATHER_ELEMENTS), max(sum(p.numel() for p in b.params) for b in buckets))
        # the gathers: (bucket numbers, each rank's first element in the scratch (its chunks of
        # them end to end), every (parameter, a, b, where its elements [a, b) are in the scratch))
        self._groups: List[Tuple[List[int], List[int], List[Tuple[torch.Tensor, int, int, int]]]] = []
        self._scratch: Optional[torch.Tensor] = None
        self._source: Optional[MPI.Intracomm] = None
        self._wire: Optional[ScatterGather] = None

    def layout(self, rank: int, size: int) -> None:
        """Chunk bounds of every bucket among ``size`` ranks, this rank's chunk buffers, and
        where every parameter's piece of each rank's chunks lies in the gather's scratch."""
        if (rank, size) == (self.rank, self.size):
            return
        self.rank, self.size = rank, size
        self.bounds = [chunk_bounds(sum(p.numel() for p in b.params), size) for b in self.buckets]
        self.chunks = [torch.zeros(bounds[rank + 1] - bounds[rank], dtype=b.flat.dtype)
                       for b, bounds in zip(self.buckets, self.bounds)]
        self._groups = []
        for group in _packed([bounds[-1] for bounds in self.bounds], max(self._room, 1)):
            segments = [0]
            for other in range(size):
                segments.append(segments[-1] + sum(self.bounds[n][other + 1] - self.bounds[n][other] for n in group))
            pieces = []  # the other ranks' (this rank's slices are its parameters' own memory)
            for other in (o for o in range(size) if o != rank):
                at = segments[other]
                for number in group:
                    begin, end = self.bounds[number][other], self.bounds[number][other + 1]
                    pieces += [(param, a, b, at + start - begin)
                               for param, a, b, start in _overlaps(self.buckets[number], begin, end)]
                    at += end - begin
            self._groups.append((group, segments, pieces))
        self._scratch = torch.empty(max(segments[-1] for _, segments, _ in self._groups),
                                    dtype=self.buckets[0].flat.dtype)

    def owned(self, params: Sequence[torch.Tensor], rank: int, size: int) -> Tuple[List[Tuple[int, int, int]],
                                                                                   List[Place]]:
        """Rank ``rank``'s slices ``(parameter index, a, b)`` among ``size`` ranks, bucket by
        bucket, and where each lies in its bucket's buffer."""
        self.layout(rank, size)
        index = {id(p): i for i, p in enumerate(params)}
        slices, places = [], []
        for number, (bucket, bounds) in enumerate(zip(self.buckets, self.bounds)):
            for param, a, b, start in _overlaps(bucket, bounds[rank], bounds[rank + 1]):
                slices.append((index[id(param)], a, b))
                places.append((number, start))
        return slices, places

    def gradient(self, place: Place, length: int) -> torch.Tensor:
        """The reduced gradient of the slice at ``place`` (a view of this rank's chunk)."""
        number, begin = place
        start = begin - self.bounds[number][self.rank]
        return self.chunks[number][start:start + length]

    def wire(self) -> ScatterGather:
        """The reduce-scatters' and allgathers' own communicator (a duplicate of the reducer's,
        made again when that one is replaced), counting into the reducer's traffic."""
        outer = self.outer()
        self.layout(outer.rank, outer.size)
        if self._source is not outer.comm or self._wire is None:
            if self._wire is not None:
                release(self._wire.context.comm)
            comm = outer.comm.Dup()
            comm.Set_errhandler(MPI.ERRORS_RETURN)
            context = Context(comm, ft=outer.ft, cuda_aware=outer.cuda_aware, launcher=outer.launcher)
            context.traffic = outer.traffic
            self._wire = ScatterGather(context, self._room * self.buckets[0].flat.element_size())
            self._source = outer.comm
        return self._wire

    def reduce(self, bucket: Bucket) -> bool:
        """Reduce-scatter ``bucket`` (the mean) and copy this rank's chunk out; whether the
        chunk may hold only finite values."""
        wire = self.wire()
        bounds = self.bounds[bucket.index]
        view, _ = array_view(bucket.flat)
        wire.reduce_scatter(view, bounds, OPS["mean"])
        chunk = self.chunks[bucket.index]
        chunk.copy_(bucket.flat[bounds[self.rank]:bounds[self.rank + 1]])
        return may_be_finite(chunk)

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

    def gather(self, places: Sequence[Place], shards: Sequence[torch.Tensor]) -> None:
        """Every rank's updated slices (this rank's: ``shards`` at ``places``, in any
        order) into every rank's parameters: one allgather per group of buckets (up to
        ``GATHER_ELEMENTS``, or one bucket), every rank's chunks of them end to end."""
        wire = self.wire()
        assert self._scratch is not None
        ordered = sorted(zip(places, shards), key=lambda pair: pair[0])  # in the chunks' order
        for group, segments, pieces in self._groups:
            mine = [shard for (number, _), shard in ordered if number in group]
            if mine:
                torch.cat(mine, out=self._scratch[segments[self.rank]:segments[self.rank + 1]])
            view, _ = array_view(self._scratch[:segments[-1]])
            wire.allgather(view, segments)
            with torch.no_grad():
                for param, a, b, at in pieces:
                    write_elements(param, a, b, self._scratch[at:at + b - a])

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
    wanted = {id(p) for p in params}
    for reducer in list(LIVE):
        if set(reducer.where) == wanted and len(wanted) == len(params) and reducer.shards is None \
                and reducer.hook is allreduce_hook and all(b.flat.device.type == "cpu" for b in reducer.buckets) \
                and resolve(reducer.comm_arg).comm == context.comm:
            return reducer
    return None


def attach(optimizer: object, reducer: Any) -> GradientShards:
    """Make ``reducer`` reduce-scatter for ``optimizer`` for as long as the optimizer lives."""
    context = weakref.WeakMethod(reducer.context)
    shards = GradientShards(reducer.buckets, lambda: context()())
    reducer.shards = shards
    weakref.finalize(optimizer, _detach, weakref.ref(reducer), shards)
    return shards


def _detach(reducer_ref: Any, shards: GradientShards) -> None:
    reducer = reducer_ref()
    if reducer is not None and reducer.shards is shards:
        reducer.shards = None
        if shards.restore():
            reducer.new_buffers()


def _packed(sizes: Sequence[int], room: int) -> List[List[int]]:
    """Consecutive indices of ``sizes`` grouped up to ``room`` in all (one alone where larger)."""
    groups: List[List[int]] = []
    used = room
    for index, size in enumerate(sizes):
        if used + size > room:
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += size
    return groups


def _overlaps(bucket: Bucket, begin: int, end: int) -> Iterator[Tuple[torch.nn.Parameter, int, int, int]]:
    """Each parameter of ``bucket`` with values in the buffer's ``[begin, end)``: the parameter,
    that part of it as ``[a, b)`` of its own values, and where it starts in the buffer."""
    offset = 0
    for param in bucket.params:
        a, b = max(begin, offset), min(end, offset + param.numel())
        if a < b:
            yield param, a - offset, b - offset, a
        offset += param.numel()
