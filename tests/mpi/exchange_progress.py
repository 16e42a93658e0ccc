"""A rank that waits in the shared-memory exchange keeps MPI's messages moving: rank 0 starts a
large Isend to rank 1 and enters a checked allreduce; rank 1 first receives that message (which,
over tcp, moves only while rank 0's MPI makes progress), then joins the allreduce. Waiting in
memory without driving MPI would hang here; run over tcp (``--mca btl tcp,self``) on one node."""
import sys

import numpy as np

import hpcreduce
from hpcreduce.collectives.node_window import shared_exchange

context = hpcreduce.init()
comm, rank = context.comm, context.rank
assert shared_exchange(context) is not None, "run on one node without fault tolerance"
big = np.full(8 << 20, rank, np.float64)  # 64 MiB: many tcp fragments
for _ in range(3):
    if rank == 0:
        request = comm.Isend(big, 1, tag=7)
        total = hpcreduce.allreduce(np.ones(4))
        request.Wait()
    else:
        if rank == 1:
            comm.Recv(big, 0, tag=7)
        total = hpcreduce.allreduce(np.ones(4))
    assert total[0] == context.size, total
comm.Barrier()
if rank == 0:
    print("exchange waits kept MPI progressing", flush=True)
sys.exit(0)
