"""Collectives over hpcreduce's communicator: allreduce, its fused form, and broadcast."""
from .allreduce import allreduce
from .broadcast import broadcast
from .buckets import GradientBuckets
from .fusion import allreduce_many

__all__ = ["allreduce", "allreduce_many", "broadcast", "GradientBuckets"]
