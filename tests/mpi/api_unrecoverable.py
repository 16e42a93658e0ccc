"""A user's script: ``train()`` under ULFM hits an unrecoverable loss (hybrid: a worker
replaced, then the last server lost) and lets the error go uncaught. Every rank, the spawned
one too, must end (``runtime.ulfm_exit``), never hang in MPI_Finalize waiting for the gone.

Run with plain python (not ``-m mpi4py``, which aborts on an uncaught error) under an ft
mpirun with 4 ranks; a replacement runs this script again and joins.
"""
import hpcreduce
from hpcreduce.ft.faults import FaultConfig
from hpcreduce.ft.inject import Kill
from hpcreduce.train import Hybrid, TrainConfig, train
from hpcreduce.train.models.ctr_data import SyntheticCTR
from hpcreduce.train.models.logreg import LogisticRegression

ctx = hpcreduce.init(ft=True)
CONFIG = TrainConfig(model="logreg", steps=10, batch=256, lr=0.05, optimizer="adagrad", topology=Hybrid(servers=1),
                     fault=FaultConfig(kills=[Kill(3, 3), Kill(0, 6)], replace=True, accept_server_loss=True))
train(LogisticRegression(hash_bits=12), SyntheticCTR(0, hash_bits=12, train_examples=20_000, test_examples=1_000),
      CONFIG, comm=ctx, verbose=False)
print(f"rank {ctx.rank}: trained through an unrecoverable loss", flush=True)
