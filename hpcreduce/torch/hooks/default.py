"""torch's default comm hooks over hpcreduce: ``allreduce_hook`` (the default; the mean through
``hpcreduce.collectives``), ``fp16_compress_hook`` and ``bf16_compress_hook`` (the bucket
travels as 16 bits, summed in float32 and rounded once: the numbers ``allreduce_gradients``
gives a 16-bit gradient)."""
from __future__ import annotations

import torch

from ...runtime.context import Comm
from .bucket import GradBucket, all_reduce


def allreduce_hook(process_group: Comm, bucket: GradBucket) -> "torch.futures.Future[torch.Tensor]":
    """The bucket's mean over the ranks of ``process_group`` (None: the wrapper's)."""
    return all_reduce(bucket.buffer(), "mean", group=process_group)


def _compress_hook(dtype: torch.dtype, process_group: Comm,
                   bucket: GradBucket) -> "torch.futures.Future[torch.Tensor]":
    buffer = bucket.buffer()
    compressed = buffer.to(dtype)
    all_reduce(compressed, "mean", group=process_group)
    buffer.copy_(compressed)
    future: "torch.futures.Future[torch.Tensor]" = torch.futures.Future()
    future.set_result(buffer)
    return future


def fp16_compress_hook(process_group: Comm, bucket: GradBucket) -> "torch.futures.Future[torch.Tensor]":
    """The bucket's mean with float16 on the wire (half of float32's bytes)."""
    return _compress_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group: Comm, bucket: GradBucket) -> "torch.futures.Future[torch.Tensor]":
    """The bucket's mean with bfloat16 on the wire (half of float32's bytes)."""
    return _compress_hook(torch.bfloat16, process_group, bucket)
