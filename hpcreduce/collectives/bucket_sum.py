"""The numpy trainers' one dense reducer: a list of arrays summed over the ranks in persistent
fusion buffers (``GradientBuckets``, planned by the one planner), reduced where they lie."""
from __future__ import annotations

from typing import List, Optional, Sequence

from .allreduce import Comm
from .buckets import GradientBuckets
from .fusion import allreduce_many


class BucketSum:
    """Sums ``arrays`` over ``comm`` (``allreduce_many(..., "sum", inplace=True)``) in buffers
    kept from call to call, made anew when the arrays' kinds, dtypes or shapes change. The
    results are views of the buffers, valid until the next call."""

    def __init__(self) -> None:
        self.buckets: Optional[GradientBuckets] = None

    def __call__(self, arrays: Sequence, comm: Comm) -> List:
        if self.buckets is None or not self.buckets.matches(arrays):
            self.buckets = GradientBuckets(arrays)
        return allreduce_many(self.buckets.load(arrays), "sum", comm=comm, inplace=True)
