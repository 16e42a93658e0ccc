"""The one-shot allreduce and the shared-memory check at more ranks than FEW (exchange.py) and
FEW_INPUTS (one_shot.py), where rows are compared and inputs combined by numpy in one call:
results against native, identical bits on every rank, and a mismatch raised everywhere."""
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce import InputMismatchError
from hpcreduce.collectives.exchange import FEW
from hpcreduce.collectives.node_window import shared_exchange
from hpcreduce.collectives.one_shot import FEW_INPUTS
from mpi_checks import expect_raised

context = hpcreduce.init()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
assert size > max(FEW, FEW_INPUTS) and shared_exchange(context) is not None, "run on one node, > 8 ranks"
failures = []
for n in (0, 1, 7, 1000, 20_000):
    for dtype in (np.float32, np.float64, np.int64):
        for op, mpi_op in (("sum", MPI.SUM), ("max", MPI.MAX)):
            x = (np.arange(n) * (rank + 1) % 97 - 40).astype(dtype) / (1 if dtype == np.int64 else 7)
            want = np.empty_like(x)
            world.Allreduce(x, want, mpi_op)
            for check in (True, False):
                got = hpcreduce.allreduce(x, op, algorithm="one_shot", check=check)
                if got.shape != x.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-4):
                    failures.append(f"{op} {np.dtype(dtype)} n={n} check={check}")
                if len(set(world.allgather(got.tobytes()))) != 1:
                    failures.append(f"{op} {np.dtype(dtype)} n={n} check={check}: ranks hold different bits")
odd = np.zeros(5 if rank == size - 1 else 4)
expect_raised(InputMismatchError, "number of elements", lambda: hpcreduce.allreduce(odd), rank)
assert hpcreduce.allreduce(np.ones(3))[0] == size
assert not failures, f"rank {rank}: {failures[:5]}"
world.Barrier()
if rank == 0:
    print(f"one-shot at {size} ranks: ok", flush=True)
sys.exit(0)
