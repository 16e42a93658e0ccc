"""Colocated checkpoints: saved at 3 ranks, loaded at 2, training goes on to the same rows.

Adagrad (optimizer state in the checkpoint), a fixed and a dynamic table, gradients that are
multiples of 1/16 (exact in any split). Then bad loads: other tables, no checkpoint.
Run under mpirun with 3 ranks: python colocated_checkpoint.py <directory>.
"""
import sys

import numpy as np

import hpcreduce
from hpcreduce.ps import Dynamic, ParamSpec, PSConfigError, dynamic_table
from hpcreduce.ps.colocated import ColocatedTables
from shared_checks import expect

ctx = hpcreduce.init()
comm, rank = ctx.comm, ctx.rank
assert ctx.size == 3, "run with 3 ranks"
DIRECTORY = sys.argv[1]
SPECS = [ParamSpec("a", (200, 3), sparse=True), dynamic_table("d", 2, Dynamic(seed=2))]
SAVED_AT, STEPS, EXAMPLES = 4, 6, 30
EVERYTHING = {"a": np.arange(200), "d": np.arange(-20, 20)}


def train(tables, until):
    while tables.clock_value < until:
        step, share, shares = tables.clock_value, tables.rank, tables.worker_count
        rng = np.random.default_rng([step, 5])
        every = {"a": rng.integers(0, 200, EXAMPLES), "d": rng.integers(-20, 20, EXAMPLES)}
        grads = ((np.arange(EXAMPLES) % 5) - 2) / 16
        mine = np.arange(share, EXAMPLES, shares)
        pushed = {}
        for spec in SPECS:
            unique, inverse = np.unique(every[spec.name][mine], return_inverse=True)
            total = np.zeros((len(unique),) + spec.shape[1:], np.float32)
            np.add.at(total, inverse, grads[mine][:, None].astype(np.float32))
            pushed[spec.name] = (unique, total)
        tables.pull_rows_many_async({name: every[name][mine] for name in every}).wait()
        tables.push_rows_many_async(pushed).wait()
        tables.clock()


three = ColocatedTables(SPECS, optimizer="adagrad", lr=0.5, comm=ctx, seed=4)
train(three, SAVED_AT)
three.save_checkpoint(DIRECTORY)
train(three, STEPS)
want = three.pull_rows_many_async(EVERYTHING).wait()

pair = comm.Split(0 if rank < 2 else 1, rank)
if rank < 2:
    two = ColocatedTables(SPECS, optimizer="adagrad", lr=0.5, comm=pair, seed=99)  # other initial rows
    two.load_checkpoint(DIRECTORY)
    assert two.clock_value == SAVED_AT
    train(two, STEPS)
    got = two.pull_rows_many_async(EVERYTHING).wait()
    for name in want:
        assert np.array_equal(got[name], want[name]), (name, np.abs(got[name] - want[name]).max())
    other = ColocatedTables([ParamSpec("a", (201, 3), sparse=True)], optimizer="adagrad", comm=pair)
    expect(PSConfigError, "it holds tables", lambda: other.load_checkpoint(DIRECTORY))
    sgd = ColocatedTables(SPECS, optimizer="sgd", comm=pair)
    expect(PSConfigError, "it holds optimizer", lambda: sgd.load_checkpoint(DIRECTORY))
    expect(PSConfigError, "No such file", lambda: two.load_checkpoint(DIRECTORY + "/nothing"))
    assert np.array_equal(two.pull_rows_many_async(EVERYTHING).wait()["a"], want["a"]), "a refused load changes nothing"
comm.Barrier()
if rank == 0:
    print("colocated checkpoint: saved at 3 ranks, loaded at 2, same rows after training on", flush=True)
