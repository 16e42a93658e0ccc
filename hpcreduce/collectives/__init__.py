"""Collectives over hpcreduce's communicator: allreduce, its fused form, broadcast, the row collectives
(``allgatherv``, ``alltoallv``, ``reduce_scatter``) and ``agree`` (one verdict on every rank)."""
from .agreement import agree
from .allreduce import allreduce
from .broadcast import broadcast
from .buckets import GradientBuckets
from .fusion import allreduce_many
from .variable import allgatherv, alltoallv, reduce_scatter

__all__ = ["agree", "allgatherv", "allreduce", "allreduce_many", "alltoallv", "broadcast", "GradientBuckets",
           "reduce_scatter"]
