"""A NaN/Inf check that costs one summing pass over a reduced bucket (about 0.1 ms for 6 MB).

A reduced bucket is the same on every rank, and a NaN or Inf in any rank's gradient reaches
it (a sum keeps them), so every rank reaches the same verdict with no message of its own.
A non-finite sum is then looked at closely (``nonfinite``): it names the parameters, and a
sum that overflowed although every value is finite is no error.
"""
from __future__ import annotations

import math
from typing import List

import torch

from .buckets import Bucket

ACCUMULATOR = {torch.float64: torch.float64}


def bucket_finite(bucket: Bucket) -> bool:
    """Whether the bucket may hold only finite values (False: look at it with ``nonfinite``)."""
    total = torch.sum(bucket.flat, dtype=ACCUMULATOR.get(bucket.flat.dtype, torch.float32))
    return math.isfinite(total.item())


def nonfinite(bucket: Bucket) -> List[str]:
    """The names of the bucket's parameters whose gradient holds a NaN or an Inf."""
    return [name for name, view in zip(bucket.names, bucket.views) if not bool(torch.isfinite(view).all())]
