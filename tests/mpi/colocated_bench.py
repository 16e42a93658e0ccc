"""Step time of a colocated pull + push against raw ``Alltoallv`` of the same bytes, interleaved.

    mpirun -n 2 python -m mpi4py tests/mpi/colocated_bench.py [tables] [batch] [bag] [dim] [rows] [rounds] [dedicated] [eager]

Each round times one step of ``ColocatedTables`` (pull of every table's ids, a bag per
example, then a push of the unique ids' gradients, clock) and then ``Alltoallv`` moving the
bytes that step moved (ids out, rows back, ids and gradients out), on the same ranks. Prints
the medians and their ratio (raw / colocated: 1.0 is as fast as the bytes allow). With
``dedicated`` after the six numbers, rank 0 is a dedicated server (``ps.start``, BSP, the same tables and SGD) and each round
also times the same step through ``ps.Worker`` on ranks 1-2: the two layouts for the same
trainers (the server's loop runs all along, as it does in a dedicated job). With ``eager``, the
colocated tables are made whole at start (``init=default_init``) instead of a row on its first
touch (the default): the same values, the start's cost against the first steps'.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.ps import Consistency, ParamSpec, Server, start
from hpcreduce.ps.colocated import ColocatedTables, default_init

TABLES, BATCH, BAG, DIM, ROWS, ROUNDS = (int(a) for a in (sys.argv[1:7] + ["26", "512", "4", "16", "100000", "20"][len(sys.argv[1:7]):]))
DEDICATED, EAGER = "dedicated" in sys.argv[7:], "eager" in sys.argv[7:]
ctx = hpcreduce.init()
specs = [ParamSpec(f"t{t}", (ROWS, DIM), sparse=True) for t in range(TABLES)]
comm = ctx.comm.Split(int(DEDICATED and ctx.rank == 0), ctx.rank)  # the trainers
dedicated = None
if DEDICATED:
    dedicated = start(specs, default_init(specs, 0), servers=1, consistency=Consistency("bsp"), lr=0.01, comm=ctx)
    if isinstance(dedicated, Server):
        dedicated.serve()
        sys.exit(0)
rank, size = comm.Get_rank(), comm.Get_size()
made = time.perf_counter()
tables = ColocatedTables(specs, lr=0.01, comm=comm, replicas=False, init=default_init(specs, 0) if EAGER else None)
made = comm.allreduce(time.perf_counter() - made, op=MPI.MAX)
rng = np.random.default_rng(rank)


def batch():
    ids = {s.name: rng.integers(0, ROWS, BATCH * BAG) for s in specs}
    grads = {}
    for name, some in ids.items():
        unique = np.unique(some)
        grads[name] = (unique, np.full((len(unique), DIM), 1e-3, np.float32))
    return ids, grads


def colocated(ids, grads):
    tables.pull_rows_many_async(ids).wait()
    tables.push_rows_many_async(grads).wait()
    tables.clock()


def through_server(ids, grads):
    dedicated.pull_rows_many_async(ids).wait()
    dedicated.push_rows_many_async(grads).wait()
    dedicated.clock()


def raw_buffers(grads):
    """Per-peer bytes of the same step: unique ids out (8 B), rows back and gradients out (4 x DIM B)."""
    unique = sum(len(u) for u, _ in grads.values())
    per_peer = comm.allreduce(unique, op=MPI.MAX) // size  # the same counts on every rank
    ids = np.zeros(per_peer * size, np.int64)
    rows = np.zeros(per_peer * size * DIM, np.float32)
    return ids, np.empty_like(ids), rows, np.empty_like(rows)


def raw(buffers):
    ids, ids_in, rows, rows_in = buffers
    comm.Alltoallv(ids, ids_in)
    comm.Alltoallv(rows, rows_in)        # rows back
    comm.Alltoallv(ids, ids_in)          # push: ids
    comm.Alltoallv(rows, rows_in)        # push: gradients


times = {"colocated": [], "raw": [], "dedicated": []}
for round_ in range(ROUNDS + 2):
    ids, grads = batch()
    buffers = raw_buffers(grads)
    runs = [("colocated", lambda: colocated(ids, grads)), ("raw", lambda: raw(buffers))]
    for name, run in runs + ([("dedicated", lambda: through_server(ids, grads))] if dedicated else []):
        comm.Barrier()
        start = time.perf_counter()
        run()
        elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if round_ >= 2:
            times[name].append(elapsed)
if rank == 0:
    c, r = float(np.median(times["colocated"])), float(np.median(times["raw"]))
    print(f"colocated pull+push: {TABLES} tables x {BATCH}x{BAG} ids x {DIM} floats, {size} ranks: "
          f"median step {c * 1e3:.2f} ms; raw Alltoallv of the same bytes {r * 1e3:.2f} ms; "
          f"raw/colocated {r / c:.3f}; tables made in {made:.1f} s ({'eager' if EAGER else 'on first touch'})",
          flush=True)
    if dedicated is not None:
        d = float(np.median(times["dedicated"]))
        print(f"dedicated (1 server + {size} workers, BSP): median step {d * 1e3:.2f} ms; "
              f"dedicated/colocated step time {d / c:.3f}", flush=True)
if dedicated is not None:
    dedicated.release()
