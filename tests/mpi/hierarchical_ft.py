"""Under fault tolerance (ULFM, tcp) the hierarchical and one-shot allreduces step aside to
messages and checks travel as messages: the results are right and no shared-memory window was
ever made (run with ft=True)."""
import sys

import numpy as np

import hpcreduce
from hpcreduce.collectives import node_window

context = hpcreduce.init()
assert context.ft, "run this under mpirun with fault tolerance (ft=True)"
x = np.arange(1000, dtype=np.float64) + context.rank
want = sum(np.arange(1000, dtype=np.float64) + r for r in range(context.size))
for _ in range(2):  # the full path, then the planned path
    assert np.array_equal(hpcreduce.allreduce(x, algorithm="hierarchical"), want)
    assert np.array_equal(hpcreduce.allreduce_many([x, x[:10].copy()], algorithm="hierarchical")[0], want)
    assert np.array_equal(hpcreduce.allreduce(x, algorithm="one_shot"), want)
    assert np.array_equal(hpcreduce.allreduce(x[:10].copy()), want[:10])
assert node_window._keyval is None, "a node window was made under fault tolerance"
print(f"rank {context.rank}: hierarchical stepped aside under fault tolerance", flush=True)
sys.exit(0)
