"""Tensor fusion: many small arrays reduced as a few large buffers.

A model's hundreds of small gradients would each pay a collective's latency. Arrays
are grouped by memory kind (host/device) and dtype, packed in order into fused
buffers of at most ``threshold_bytes``, each buffer is reduced once, and the results
are unpacked. An array larger than the threshold is reduced on its own, uncopied.
Cost: one allreduce per fused buffer plus a copy in and a copy out of every byte.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .allreduce import CHECK, Comm, reduce_flat
from ..arrays import array_module, is_device_array
from .workspace import workspace
from .ops import OP_NAMES, OPS
from .validate import (ALGORITHMS, agree, array_problem, choice_problem, first_problem,
                       raise_local, stable_hash)
from ..runtime.context import resolve
from ..runtime.settings import Setting, positive_integer

FUSION_BYTES = Setting("HPCREDUCE_FUSION_BYTES", positive_integer, 64 << 20, "a number of bytes above 0")
"""Fusion buffer size: 64 MiB unless set (Horovod's default)."""


def plan_buckets(arrays: Sequence, threshold_bytes: int) -> List[List[int]]:
    """Indices of ``arrays`` grouped into fused buckets: same kind and dtype, in order,
    each at most ``threshold_bytes`` (an oversized array alone)."""
    open_buckets: Dict[Tuple[bool, str], List[int]] = {}
    filled: Dict[Tuple[bool, str], int] = {}
    buckets: List[List[int]] = []
    for index, x in enumerate(arrays):
        key = (is_device_array(x), x.dtype.str)
        if key in open_buckets and filled[key] + x.nbytes > threshold_bytes:
            buckets.append(open_buckets.pop(key))
        if key not in open_buckets:
            open_buckets[key], filled[key] = [], 0
        open_buckets[key].append(index)
        filled[key] += x.nbytes
    buckets.extend(open_buckets.values())
    return sorted(buckets, key=lambda bucket: bucket[0])


def allreduce_many(arrays: Sequence, op: str = "sum", *, algorithm: str = "auto",
                   comm: Comm = None, inplace: bool = False, check: Optional[bool] = None,
                   threshold_bytes: Optional[int] = None) -> list:
    """Reduce every array in ``arrays`` over all ranks; return the results in order.

    Same ops, dtypes and ``comm`` as ``allreduce``; arrays may differ in shape and dtype
    from each other and need not be contiguous, but every rank must pass the same list.
    ``inplace=True`` writes each result back into its input array and returns them;
    otherwise each result is a new array.
    """
    context = resolve(comm)
    arrays = list(arrays)
    local = first_problem(choice_problem(op, algorithm),
                          *(_fusable_problem(x) for x in arrays))
    if CHECK.value() if check is None else check:
        layout = [(getattr(x, "dtype", None) and x.dtype.str, tuple(getattr(x, "shape", ())))
                  for x in arrays]
        agree(context.comm, "allreduce_many", [
            ("number of arrays", len(arrays)),
            ("op", OP_NAMES.index(op) if op in OP_NAMES else -1),
            ("algorithm", ALGORITHMS.index(algorithm) if algorithm in ALGORITHMS else -1),
            ("dtypes and shapes (hashed)", stable_hash(layout)),
        ], local)
    else:
        raise_local("allreduce_many", local, context.rank)
    reduce_op = OPS[op]
    threshold = FUSION_BYTES.value() if threshold_bytes is None else threshold_bytes
    results = list(arrays) if inplace else [None] * len(arrays)
    for bucket in plan_buckets(arrays, threshold):
        first = arrays[bucket[0]]
        xp = array_module(first)
        if len(bucket) == 1 and first.flags.c_contiguous:
            target = first if inplace else xp.empty_like(first)
            reduce_flat(context, first.reshape(-1), target.reshape(-1), reduce_op, algorithm)
            results[bucket[0]] = target
            continue
        total = sum(arrays[i].size for i in bucket)
        kind = "device" if is_device_array(first) else "host"
        fused = workspace(context.cache, kind).get("fusion", first.dtype, total)
        xp.concatenate([arrays[i].reshape(-1) for i in bucket], out=fused)
        reduce_flat(context, fused, fused, reduce_op, algorithm)
        offset = 0
        for i in bucket:
            x = arrays[i]
            piece = fused[offset:offset + x.size].reshape(x.shape)
            if inplace:
                x[...] = piece
            else:
                results[i] = piece.copy()
            offset += x.size
    return results


def _fusable_problem(x):
    """Like ``array_problem``, but fusion copies, so any layout is fine."""
    found = array_problem(x)
    return None if found is not None and found.kind.code == 3 else found
