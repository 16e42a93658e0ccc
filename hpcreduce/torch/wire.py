"""One bucket's sum over the ranks (its gradients came in divided by N: the mean), at full
precision, or 16 bits on the wire with float32 sums.

Full precision (a float32/float64 bucket, no compression): ``MPI_Allreduce`` (SUM) in the
bucket's own memory (a CUDA bucket through a host copy unless MPI is CUDA-aware). 16 bits (a
bfloat16/float16 bucket, or ``compression`` "bf16"/"fp16" on a float32 one): the bucket, cast to
16 bits and padded to N equal chunks, goes through ``MPI_Alltoall`` (rank r receives every
rank's chunk r), rank r sums its chunk in float32, rounds it to 16 bits, and ``MPI_Allgather``
gives every rank every chunk; each rank casts the same 16-bit result back into its bucket, so
all ranks hold identical values. Bytes each rank sends per bucket of n values: 2 (N-1)/N n x 4
at float32 (Open MPI's own algorithm choice, ring-like for large buckets) and 2 (N-1)/N n x 2 at
16 bits: half.
"""
from __future__ import annotations

from typing import Optional

import torch
from mpi4py import MPI

from .buckets import Bucket

COMPRESSIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}
NARROW = (torch.bfloat16, torch.float16)


def wire_dtype(bucket_dtype: torch.dtype, compression: Optional[str]) -> torch.dtype:
    """The dtype a bucket travels in: 16-bit buckets as they are, others as ``compression`` asks."""
    if bucket_dtype in NARROW:
        return bucket_dtype
    return COMPRESSIONS[compression] if compression else bucket_dtype


class BucketWire:
    """How one bucket is reduced, with its persistent staging buffers."""

    def __init__(self, bucket: Bucket, compression: Optional[str], cuda_aware: bool):
        self.bucket = bucket
        self.dtype = wire_dtype(bucket.flat.dtype, compression)
        self.direct = bucket.flat.device.type == "cpu" or cuda_aware
        self._send: Optional[torch.Tensor] = None
        self._recv: Optional[torch.Tensor] = None
        self._host: Optional[torch.Tensor] = None

    def bytes_sent(self, size: int) -> int:
        """Bytes this rank sends for one reduction of the bucket among ``size`` ranks."""
        count = self.bucket.flat.numel()
        if self.dtype in NARROW:
            count = -(-count // size) * size
        return 2 * (size - 1) * count * torch.tensor([], dtype=self.dtype).element_size() // size

    def reduce(self, comm: MPI.Intracomm) -> None:
        """Replace the bucket by its sum over ``comm``'s ranks (collective)."""
        if comm.Get_size() == 1:
            return
        if self.dtype in NARROW:
            self._reduce_narrow(comm)
        else:
            self._reduce_full(comm)

    def _reduce_full(self, comm: MPI.Intracomm) -> None:
        flat = self.bucket.flat
        if self.direct:
            comm.Allreduce(MPI.IN_PLACE, mpi_buffer(flat), op=MPI.SUM)
        else:
            if self._host is None:
                self._host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            self._host.copy_(flat)
            comm.Allreduce(MPI.IN_PLACE, mpi_buffer(self._host), op=MPI.SUM)
            flat.copy_(self._host)

    def _reduce_narrow(self, comm: MPI.Intracomm) -> None:
        flat, size = self.bucket.flat, comm.Get_size()
        count = flat.numel()
        chunk = -(-count // size)
        if self._send is None or self._send.numel() != chunk * size:
            self._send = torch.zeros(chunk * size, dtype=self.dtype)
            self._recv = torch.empty(chunk * size, dtype=self.dtype)
        send, recv = self._send, self._recv
        send[:count].copy_(flat)
        comm.Alltoall(mpi_buffer(send), mpi_buffer(recv))
        mine = recv.view(size, chunk).sum(0, dtype=torch.float32).to(self.dtype)
        comm.Allgather(mpi_buffer(mine), mpi_buffer(send))
        flat.copy_(send[:count])


def mpi_buffer(tensor: torch.Tensor):
    """A buffer MPI reads and writes in ``tensor``'s own memory: 16-bit floats as int16 (MPI has
    no bfloat16), CUDA tensors through cupy (DLPack; the tensor's stream must be synchronised)."""
    raw = tensor.view(torch.int16) if tensor.dtype in NARROW else tensor
    if raw.device.type == "cuda":
        import cupy
        return cupy.from_dlpack(raw)
    return raw.numpy()
