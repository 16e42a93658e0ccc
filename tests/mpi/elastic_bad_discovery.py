"""hpcreduce.elastic under real mpirun with ULFM (2 ranks): a discovery file rewritten, commit
after commit, to texts rank 0 cannot use (digits ``int`` refuses, a bad line, undecodable
bytes) is a warning on rank 0, once per problem, and never ends or hangs the run. Argument:
the discovery file. Prints "ok" per rank, and rank 0 each warning as "warned: TEXT"."""
import sys
import warnings

import hpcreduce
from hpcreduce import elastic
from hpcreduce.runtime.files import atomic_file

ctx = hpcreduce.init(ft=True)
path = sys.argv[1]
BAD = [b"\xc2\xb2\n", b"+-3\n", b"node1:\xc2\xb2\n", b"a b\n", b"\xff\xfe", b"+-3\n"]


@elastic.run
def train(state):
    while state.commits < len(BAD) + 2:
        if ctx.rank == 0 and state.commits <= len(BAD):
            with atomic_file(path, "wb") as out:
                out.write(BAD[state.commits - 1])
        ctx.comm.barrier()
        state.total += hpcreduce.allreduce(__import__("numpy").ones(1), "sum")[0]
        state.commit()
    return state.total


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    total = train(elastic.State(discover=path, total=0.0))
for warning in caught:
    print(f"warned: {warning.message}", flush=True)
assert total == 2.0 * (len(BAD) + 1) and ctx.size == 2, (total, ctx.size)
print("ok", flush=True)
