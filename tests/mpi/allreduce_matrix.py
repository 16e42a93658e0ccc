"""Every op, dtype, algorithm and awkward size against native MPI_Allreduce, on any N and any
number of nodes (tests/test_hierarchical.py runs it on two "nodes" of this host, for the
algorithms that depend on the nodes). Arguments: the algorithms to check (default: all).

Run under mpirun; exits non-zero on the first disagreement (collectively).
"""
import socket
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.collectives.ops import DTYPES, OPS
from mpi_checks import sample

context = hpcreduce.init()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
ALGORITHMS = tuple(sys.argv[1:]) or ("ring", "recursive_doubling", "native", "hierarchical", "one_shot", "auto")
SIZES = sorted({0, 1, max(size - 1, 0), size + 1, 1_000_003})
LARGE = 1_000_003  # several 1 MiB segments a chunk: checked with sum and mean only (the other ops
LARGE_OPS = ("sum", "mean")  # differ by their ufunc alone, which the small sizes check), for time
TOLERANCE = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def expected(x: np.ndarray, op: str) -> np.ndarray:
    reference = np.empty_like(x)
    world.Allreduce(x, reference, op=OPS[op].mpi_op)
    if op == "mean":
        reference = (reference / size if x.dtype.kind == "f" else reference // size).astype(x.dtype)
    return reference


failures = []
checked = 0
for n in SIZES:
    for dtype in DTYPES:
        for op in (LARGE_OPS if n == LARGE else OPS):
            x = sample(dtype, op, n, seed=1000 * rank + n % 997)
            reference = expected(x, op)
            for algorithm in ALGORITHMS:
                result = hpcreduce.allreduce(x, op, algorithm=algorithm)
                outcomes = [("result", result)]
                if n < 1000 or dtype.itemsize == 8:  # in place, multi-segment chunks included
                    in_place = x.copy()
                    hpcreduce.allreduce(in_place, op, algorithm=algorithm, out=in_place)
                    outcomes.append(("in place", in_place))
                checked += len(outcomes)
                tol = TOLERANCE.get(dtype.name, 0)
                for label, got in outcomes:
                    if got.shape != x.shape or got.dtype != x.dtype:
                        failures.append(f"{label} {algorithm} {op} {dtype} n={n}: got {got.dtype}{got.shape}")
                    elif not np.allclose(got.astype(np.float64), reference.astype(np.float64),
                                         rtol=tol, atol=tol * 50, equal_nan=True):
                        bad = int(np.argmax(~np.isclose(got.astype(np.float64), reference.astype(np.float64),
                                                       rtol=tol, atol=tol * 50)))
                        failures.append(f"{label} {algorithm} {op} {dtype} n={n}: element {bad} "
                                        f"{got[bad]} != native {reference[bad]}")
                # Data-parallel replicas must stay identical: every rank holds the same bits.
                digest = np.frombuffer(result.tobytes(), dtype=np.uint8).sum(dtype=np.uint64) if n else 0
                digests = world.allgather(int(digest))
                if len(set(digests)) != 1:
                    failures.append(f"{algorithm} {op} {dtype} n={n}: ranks hold different bits {digests}")

# Back-to-back calls of changing sizes, nothing in between (no check, as between fusion buckets,
# or for one_shot the check carried in the same exchange): a rank that finished a call writes
# its input for the next one while a slower rank may still read the last one.
for algorithm in [name for name in ("hierarchical", "one_shot") if name in ALGORITHMS]:
    wrong = []
    for call in range(400):  # every rank makes every call, whatever it finds
        n = (150, 100, 1000, 37)[call % 4] * (1 + call % 3)
        checking = algorithm == "one_shot" and call % 2 == 0
        got = hpcreduce.allreduce(np.full(n, rank + call, np.int64), "sum", algorithm=algorithm, check=checking)
        if not (got == size * call + size * (size - 1) // 2).all():
            wrong.append(call)
    if wrong:
        failures.append(f"back-to-back {algorithm} calls: {len(wrong)} of 400 wrong, the first call {wrong[0]}")
    checked += 400

all_failures = world.allgather(failures)
nodes = len(set(world.allgather(socket.gethostname())))
if rank == 0:
    flat = [f"rank {r}: {f}" for r, fs in enumerate(all_failures) for f in fs]
    print(f"N={size} on {nodes} node(s): {checked} cases, {len(flat)} failures")
    for line in flat[:20]:
        print(line)
sys.exit(1 if any(all_failures) else 0)
