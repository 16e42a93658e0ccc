"""hpcreduce on cupy arrays against MPI's own result on host copies (needs a GPU).

Every op, dtype and algorithm at awkward sizes, in place and not; kernels still running
on a non-blocking stream when allreduce is called (and a stream switch between calls);
fusion of mixed host/device and strided arrays; bad device input. Ranks may share a GPU.

GPU_TEST_PATH=staged expects the staged path (the test sets HPCREDUCE_CUDA_AWARE=0);
GPU_TEST_PATH=direct expects CUDA-aware MPI and prints "skip: ..." where MPI is not.
"""
import os
import sys

import cupy
import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.collectives.ops import DTYPES, OPS
from hpcreduce.collectives.transfer import transfer_kind
from hpcreduce.runtime.devices import select_device
from mpi_checks import expect_raised, run_checks, sample

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
device = select_device()
context = hpcreduce.init()
path = transfer_kind(True, context.cuda_aware)
wanted = os.environ.get("GPU_TEST_PATH", "staged")
if wanted == "direct" and path != "device":
    if rank == 0:
        print("skip: this MPI is not CUDA-aware (its MPIX query says no), so there is no direct path")
    sys.exit(0)
ALGORITHMS = ("ring", "recursive_doubling", "native", "one_shot", "auto")
TOLERANCE = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}

LATE_FILL = cupy.RawKernel(r"""
extern "C" __global__ void late_fill(float* x, float value, long long n, long long cycles) {
    long long start = clock64();
    while (blockIdx.x == gridDim.x - 1 && clock64() - start < cycles) { }
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
""", "late_fill")


def reference(x, op):
    want = np.empty_like(x)
    world.Allreduce(x, want, op=OPS[op].mpi_op)
    if op == "mean":
        want = (want / size if x.dtype.kind == "f" else want // size).astype(x.dtype)
    return want


def close(got, want, dtype):
    tol = TOLERANCE.get(np.dtype(dtype).name, 0)
    return np.allclose(np.asarray(got, np.float64), want.astype(np.float64), rtol=tol, atol=tol * 50)


def check_every_op_dtype_algorithm():
    wrong = []
    for n in sorted({0, 1, size + 1, 1_000_003}):
        for dtype in DTYPES:
            for op in OPS:
                host = sample(dtype, op, n, seed=1000 * rank + n % 997)
                want = reference(host, op)
                x = cupy.asarray(host)
                for algorithm in ALGORITHMS:
                    got = hpcreduce.allreduce(x, op, algorithm=algorithm)
                    assert isinstance(got, cupy.ndarray) and got.dtype == x.dtype and got.shape == x.shape
                    in_place = x.copy()
                    hpcreduce.allreduce(in_place, op, algorithm=algorithm, out=in_place)
                    for label, result in (("out", got), ("in place", in_place)):
                        if not close(result.get(), want, dtype):
                            wrong.append(f"{algorithm} {label} {op} {dtype} n={n}")
                assert (x.get() == host).all(), "the input was changed"
    assert not wrong, f"rank {rank}: {len(wrong)} wrong, e.g. {wrong[:4]}"


def late_input(n, value):
    """A device array whose last block of values a kernel writes only after ~20 ms of spinning."""
    x = cupy.zeros(n, dtype=cupy.float32)
    LATE_FILL(((n + 255) // 256,), (256,), (x, np.float32(value), np.int64(n), np.int64(40_000_000)))
    return x


def check_waits_for_queued_kernels():
    """The input is still being written on a non-blocking stream when allreduce starts;
    consecutive calls switch streams. A transfer that hands MPI memory too early sums zeros."""
    n = 3 * size * (1 << 18) + 5  # several 1 MiB ring segments per chunk
    want = size * (size + 1) / 2
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    for i, algorithm in enumerate(ALGORITHMS * 2):
        with streams[i % 2]:
            x = late_input(n, rank + 1)
            got = hpcreduce.allreduce(x, algorithm=algorithm)
            in_place = late_input(n, rank + 1)
            hpcreduce.allreduce(in_place, algorithm=algorithm, out=in_place)
            values = [got.get(), in_place.get()]
        for label, value in zip(("out", "in place"), values):
            assert (value == want).all(), (f"rank {rank}: {algorithm} {label} on a busy stream: "
                                           f"{np.unique(value)[:5]} instead of {want}")


def check_fusion_mixed_arrays():
    rng = np.random.default_rng(rank)
    host = [rng.standard_normal((3, 5)).astype(np.float32), np.arange(7, dtype=np.int64) * rank,
            rng.standard_normal((40, 40)), rng.standard_normal(11).astype(np.float16),
            rng.standard_normal(300_001).astype(np.float32), np.zeros(0, np.float32)]
    arrays = [cupy.asarray(host[0]), host[1], cupy.asarray(host[2])[:, ::2], cupy.asarray(host[3]),
              cupy.asarray(host[4]), cupy.asarray(host[5])]
    want = [reference(np.ascontiguousarray(cupy.asnumpy(a)), "sum") for a in arrays]
    for threshold in (64, 1 << 20):
        for got, expected, a in zip(hpcreduce.allreduce_many(arrays, "sum", threshold_bytes=threshold),
                                    want, arrays):
            assert type(got) is type(a) and got.shape == a.shape and got.dtype == a.dtype, (type(got), a.shape)
            assert close(cupy.asnumpy(got), expected, a.dtype), (threshold, a.dtype, a.shape)
    copies = [a.copy() for a in arrays]
    returned = hpcreduce.allreduce_many(copies, "mean", inplace=True, threshold_bytes=4096)
    assert all(r is c for r, c in zip(returned, copies))
    for got, expected in zip(copies, want):
        mean = (expected / size if expected.dtype.kind == "f" else expected // size).astype(expected.dtype)
        assert close(cupy.asnumpy(got), mean, expected.dtype), got.dtype


def check_bad_device_input():
    def expect(error, fragment, call):
        expect_raised(error, fragment, call, rank)
        assert float(hpcreduce.allreduce(cupy.ones(3))[0]) == size  # nothing was lost
    x = cupy.ones(6, dtype=cupy.float32)
    expect(hpcreduce.InputMismatchError, "out=", lambda: hpcreduce.allreduce(x, out=np.empty(6, np.float32)))
    strided = cupy.ones(12, cupy.float32)[::2] if rank == 1 else x
    expect(TypeError, "rank 1 passed a non-contiguous array", lambda: hpcreduce.allreduce(strided))
    typed = cupy.ones(6, cupy.complex64)
    expect(TypeError, "unsupported dtype", lambda: hpcreduce.allreduce(typed))


if rank == 0:
    print(f"path={path} ranks={size} gpus={cupy.cuda.runtime.getDeviceCount()} device={device}", flush=True)
run_checks(check_every_op_dtype_algorithm, check_waits_for_queued_kernels, check_fusion_mixed_arrays,
           check_bad_device_input)
sys.exit(0)
