"""Collectives over hpcreduce's communicator: allreduce and its fused form."""
from .allreduce import allreduce
from .buckets import GradientBuckets
from .fusion import allreduce_many

__all__ = ["allreduce", "allreduce_many", "GradientBuckets"]
