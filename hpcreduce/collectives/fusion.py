"""Tensor fusion: many small arrays reduced as a few large buffers.

A model's hundreds of small gradients would each pay a collective's latency. Arrays
are grouped by memory kind (host/device) and dtype, packed in order into fused
buffers of at most ``threshold_bytes``, each buffer is reduced once, and the results
are unpacked. An array larger than the threshold is reduced on its own, uncopied.
Cost: one allreduce per fused buffer plus a copy in and a copy out of every byte; with
``inplace=True``, arrays that are views of persistent fusion buffers (``buckets``,
``GradientBuckets``) are reduced where they lie, with no copy.
Every local check (arrays, settings, memory) runs before the first byte moves.
A float16 sum or mean is accumulated in float32 and rounded once (``narrow``), as
``hpcreduce.torch``'s DDP reduces 16-bit buckets, so both give the same numbers.
A call that repeats the context's last one (the same array objects, unchanged, with the same
op, algorithm, threshold and settings: a training loop's gradients) skips the per-array work
(``ManyPlan``): it costs one comparison per array, the check allreduce and the reductions.
"""
from __future__ import annotations

import functools
import operator
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .allreduce import CHECK, Comm, reduce_flat
from .buckets import FUSION_BYTES, bucket_region, plan_buckets
from ..arrays import array_module, is_device_array
from .memory import first_overlap
from .narrow import is_narrow_sum, narrow_allreduce
from .workspace import workspace
from .ops import OP_NAMES, OPS
from .selection import TABLE, table_text
from .validate import (ALGORITHMS, InputProblem, PlannedCheck, ProblemKind, agree, array_labels, array_problem,
                       choice_problem, first_problem, labelled, layout_fields, raise_local, read_only_problem,
                       setting_value, stable_hash)
from ..runtime.context import resolve
from ..runtime.settings import generation

__all__ = ["allreduce_many"]

REPEATED = "allreduce_many.last"
"""The context-cache slot of the last call's ``ManyPlan``."""


def allreduce_many(arrays: Sequence, op: str = "sum", *, algorithm: str = "auto",
                   comm: Comm = None, inplace: bool = False, check: Optional[bool] = None,
                   threshold_bytes: Optional[int] = None, names: Optional[Sequence[str]] = None) -> list:
    """Reduce every array in ``arrays`` over all ranks; return the results in order.

    Same ops, dtypes and ``comm`` as ``allreduce``; arrays may differ in shape and dtype
    from each other and need not be contiguous, but every rank must pass the same list
    (and the same fusion threshold and auto table). ``inplace=True`` writes each result
    back into its input array (which must be writeable and share no memory with another)
    and returns them; otherwise each result is a new array. ``names`` label the arrays
    in error messages. If a reduction fails midway (e.g. a failed peer), the error's
    notes say which arrays already hold their result.
    """
    context = resolve(comm)
    arrays = list(arrays)
    names = None if names is None else tuple(names)
    call = (op, algorithm, inplace, threshold_bytes, names)
    last = context.cache.get(REPEATED)
    if last is not None and last.fits(arrays, call):
        results, local = _prepare(context, arrays, last.buckets, last.regions, inplace)
        if local is None:
            if last.checking if check is None else check:
                last.check.run(context)
            _reduce_buckets(context, arrays, last.buckets, last.regions, results, OPS[op], algorithm, inplace)
            return results
    made = generation()
    labels = array_labels(names, len(arrays))
    checking, local = (check, None) if check is not None else setting_value(CHECK, True)
    threshold, unusable = (threshold_bytes, None) if threshold_bytes is not None else setting_value(FUSION_BYTES, 0)
    table, unusable_table = setting_value(TABLE, ()) if algorithm == "auto" else ((), None)
    local = first_problem(local, unusable, unusable_table, choice_problem(op, algorithm),
                          *(_fusable_problem(x, label, inplace) for x, label in zip(arrays, labels)))
    plan, results = [], []
    if local is None:
        local = _overlap_problem(arrays, labels) if inplace else None
    regions: list = []
    if local is None:
        plan = plan_buckets(arrays, threshold)
        regions = [bucket_region(arrays, bucket) if inplace else None for bucket in plan]
        results, local = _prepare(context, arrays, plan, regions, inplace)
    count, layout = layout_fields(arrays, labels)
    fields = [
        count,
        ("op", OP_NAMES.index(op) if op in OP_NAMES else -1, op),
        ("algorithm", ALGORITHMS.index(algorithm) if algorithm in ALGORITHMS else -1, algorithm),
        ("fusion threshold (HPCREDUCE_FUSION_BYTES)", threshold, threshold),
        ("auto table (HPCREDUCE_AUTO_TABLE)", _table_code(table), lambda: table_text(table)),
        layout,
    ]
    if checking:
        agree(context, "allreduce_many", fields, local)
    else:
        raise_local("allreduce_many", local, context.rank)
    default_check, unusable_check = (checking, None) if check is None else setting_value(CHECK, True)
    if unusable_check is None and all(type(x) is np.ndarray for x in arrays):
        context.cache[REPEATED] = ManyPlan(arrays, call, made, default_check, plan, regions, fields)
    _reduce_buckets(context, arrays, plan, regions, results, OPS[op], algorithm, inplace)
    return results


class ManyPlan:
    """A checked ``allreduce_many`` call, kept so that a call that repeats it skips the per-array
    checks, the bucket plan and the search for bucket regions. It holds the arrays themselves (so
    none is freed or reallocated while kept: ids and addresses stay theirs) and each one's shape,
    strides, dtype and writeability, which are compared on every call (numpy lets them change)."""

    __slots__ = ("arrays", "fingerprint", "call", "generation", "checking", "buckets", "regions", "check")

    def __init__(self, arrays: list, call: tuple, made: int, checking: bool, buckets: List[List[int]],
                 regions: list, fields: list) -> None:
        self.arrays, self.fingerprint, self.call, self.generation = arrays, _fingerprint(arrays), call, made
        self.checking, self.buckets, self.regions = checking, buckets, regions
        self.check = PlannedCheck("allreduce_many", fields)

    def fits(self, arrays: list, call: tuple) -> bool:
        """Whether ``arrays`` and ``call`` repeat the kept call, under the same settings."""
        return (call == self.call and self.generation == generation() and len(arrays) == len(self.arrays)
                and all(map(operator.is_, arrays, self.arrays)) and _fingerprint(arrays) == self.fingerprint)


def _fingerprint(arrays: list) -> list:
    return [(x.shape, x.strides, x.dtype, x.flags.writeable) for x in arrays]


def _reduce_buckets(context, arrays: list, plan: List[List[int]], regions: list, results: list, reduce_op,
                    algorithm: str, inplace: bool) -> None:
    """Reduce each bucket of ``plan`` into ``results`` (a bucket with a region, see
    ``buckets.bucket_region``, where it lies); on a failure, note what was applied."""
    done: List[int] = []
    try:
        for bucket, region in zip(plan, regions):
            first = arrays[bucket[0]]
            if region is not None:
                _reduce(context, region, region, reduce_op, algorithm)
                done.extend(bucket)
                continue
            if len(bucket) == 1 and first.flags.c_contiguous:
                _reduce(context, first.reshape(-1), results[bucket[0]].reshape(-1), reduce_op, algorithm)
                done.append(bucket[0])
                continue
            total = sum(arrays[i].size for i in bucket)
            kind = "device" if is_device_array(first) else "host"
            fused = workspace(context.cache, kind).get("fusion", first.dtype, total)
            array_module(first).concatenate([arrays[i].reshape(-1) for i in bucket], out=fused)
            _reduce(context, fused, fused, reduce_op, algorithm)
            offset = 0
            for i in bucket:
                results[i][...] = fused[offset:offset + arrays[i].size].reshape(arrays[i].shape)
                offset += arrays[i].size
                done.append(i)
    except BaseException as err:
        if inplace:
            applied = f"arrays {sorted(done)} already hold the reduced result" if done else "no array was changed"
            # PEP 678's notes (printed with the traceback from Python 3.11; add_note is 3.11+ only)
            err.__notes__ = [*getattr(err, "__notes__", []), f"allreduce_many(inplace=True) stopped midway: "
                             f"on this rank {applied}; the others still hold this rank's input"]
        raise


def _reduce(context, x, out, reduce_op, algorithm: str) -> None:
    """One flat buffer's reduction (checked already): float16 sums through ``narrow``."""
    if not is_narrow_sum(x.dtype, reduce_op.name):
        reduce_flat(context, x, out, reduce_op, algorithm)
        return
    if out is not x:
        out[...] = x
    narrow_allreduce(context, out.view(array_module(out).uint16), "float16", reduce_op, check=False)


def _prepare(context, arrays: list, plan: List[List[int]], regions: list,
             inplace: bool) -> Tuple[list, Optional[InputProblem]]:
    """The result arrays and the fusion workspace, allocated before any communication."""
    try:
        results = list(arrays) if inplace else [array_module(x).empty(x.shape, x.dtype) for x in arrays]
        for bucket, region in zip(plan, regions):
            first = arrays[bucket[0]]
            if region is None and (len(bucket) > 1 or not first.flags.c_contiguous):
                kind = "device" if is_device_array(first) else "host"
                workspace(context.cache, kind).get("fusion", first.dtype, sum(arrays[i].size for i in bucket))
        return results, None
    except MemoryError as err:
        return [], InputProblem(ProblemKind.OUT_OF_MEMORY, str(err))


def _fusable_problem(x, label: str, inplace: bool) -> Optional[InputProblem]:
    """Like ``array_problem`` (but fusion copies, so any layout is fine), and writeable when in place."""
    found = array_problem(x)
    if found is not None and found.kind is not ProblemKind.NOT_CONTIGUOUS:
        return labelled(found, label)
    return read_only_problem(x, label) if inplace else None


def _overlap_problem(arrays: list, labels: List[str]) -> Optional[InputProblem]:
    pair = first_overlap(arrays)
    return None if pair is None else InputProblem(ProblemKind.OVERLAPPING,
                                                  f"{labels[pair[0]]} and {labels[pair[1]]}")


_table_code = functools.lru_cache(maxsize=8)(stable_hash)

