"""hpcreduce.elastic under real mpirun with ULFM (3 ranks): State's commit/restore/sync on
numpy arrays, torch tensors and scalars, its refusals, and a
torch loop with ``hpcreduce.torch.allreduce_gradients`` surviving a SIGKILL of rank 2 at
step 3 of 8: every survivor ends at step 8 with the same weights. Prints "ok NAME" per check."""
import os
import signal

import numpy as np

import hpcreduce
from hpcreduce import elastic
from hpcreduce.errors import UnsupportedInputError
from mpi_checks import expect_raised

import torch

ctx = hpcreduce.init(ft=True)
rank = ctx.rank


def same_everywhere(values) -> bool:
    return all(np.array_equal(values, other) for other in ctx.comm.allgather(values))


def check_commit_restore_sync():
    state = elastic.State(weights=np.full(4, float(rank)), step=rank, note={"rank": rank})
    state.weights += 1.0
    state.step += 10
    state.note["rank"] = -1
    state.restore()
    assert state.weights.tolist() == [float(rank)] * 4 and state.step == rank and state.note == {"rank": rank}
    view = state.weights
    state.sync()
    assert view is state.weights, "arrays are synced in place"
    assert state.weights.tolist() == [0.0] * 4 and state.step == 0 and state.note == {"rank": 0}


def check_torch_values():
    layer = torch.nn.Linear(3, 2)
    state = elastic.State(weight=layer.weight, bias=layer.bias)
    before = layer.weight.detach().clone()
    with torch.no_grad():
        layer.weight.add_(1.0)
    state.restore()
    assert torch.equal(layer.weight, before), "restored in place, into the module's own parameter"
    state.sync()
    assert same_everywhere(layer.weight.detach().numpy()) and same_everywhere(layer.bias.detach().numpy())


def check_refusals():
    expect_raised(UnsupportedInputError, "not named commit", lambda: elastic.State(commit=1), rank)
    expect_raised(UnsupportedInputError, "at least one value", lambda: elastic.State(), rank)
    state = elastic.State(step=0)
    expect_raised(AttributeError, "tracks no value named 'stpe'", lambda: state.stpe, rank)
    expect_raised(AttributeError, "tracks no value named 'lr'", lambda: setattr(state, "lr", 0.1), rank)


def check_torch_loop_survives_a_kill():
    from hpcreduce.torch import allreduce_gradients
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = elastic.State(weight=model.weight, bias=model.bias, step=0)

    @elastic.run
    def train(state):
        while state.step < 8:
            if state.step == 3 and rank == 2 and ctx.size == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            generator = torch.Generator().manual_seed(state.step)
            x = torch.randn(12, 4, generator=generator)[ctx.rank::ctx.size]
            optimizer.zero_grad()
            (model(x) ** 2).sum().backward()
            allreduce_gradients(model, "sum")
            optimizer.step()
            state.step += 1
            state.commit()

    train(state)
    assert ctx.size == 2 and state.step == 8 and [e["lost"] for e in state.events] == [[2]], state.events
    assert same_everywhere(model.weight.detach().numpy())


for check in (check_commit_restore_sync, check_torch_values, check_refusals, check_torch_loop_survives_a_kill):
    check()
    print(f"ok {check.__name__} (rank {rank})", flush=True)
