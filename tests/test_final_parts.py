"""The end of a PS run, one process (MPI.COMM_SELF; what MPI adds is the allgather of the
parts): a shard that holds no row is a normal state, whose checksum part is 0."""
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from hpcreduce.train.model import SparseRows
from hpcreduce.train.ps.final import sharded_checksum
from hpcreduce.train.results import checksum


def test_a_dynamic_shard_without_rows_adds_nothing_to_the_checksum():
    layout = SimpleNamespace(specs=[SimpleNamespace(name="embeddings"), SimpleNamespace(name="dense")])
    ids, rows = np.array([3, 9], np.int64), np.arange(8, dtype=np.float32).reshape(2, 4)
    empty = SimpleNamespace(sparse=True, ids=np.empty(0, np.int64), values=np.empty((0, 4), np.float32))
    dense = SimpleNamespace(sparse=False, start=0, values=np.ones(5, np.float32))
    assert sharded_checksum(MPI.COMM_SELF, layout, SimpleNamespace(tables={0: empty, 1: dense})) == \
        checksum({"dense": np.ones(5, np.float32)})
    held = SimpleNamespace(sparse=True, ids=ids, values=rows)
    assert sharded_checksum(MPI.COMM_SELF, layout, SimpleNamespace(tables={0: held})) == \
        checksum({"embeddings": SparseRows(ids, rows)}) != 0
