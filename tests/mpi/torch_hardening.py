"""hpcreduce.torch with a problem on one rank only (any N >= 2): every rank raises the same
clear error naming the parameters and ranks, before anything changes; nothing hangs."""
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import InputMismatchError, UnsupportedInputError
from mpi_checks import expect_raised

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
torch.manual_seed(rank)


def expect_everywhere(error, fragments, call):
    for fragment in fragments:
        expect_raised(error, fragment, call, rank)


def check_broadcast_root():
    model = torch.nn.Linear(3, 2)
    before = model.weight.detach().clone()
    expect_everywhere(InputMismatchError, ["asked for a root outside the communicator", "root=5", f"has {size} ranks"],
                      lambda: hpt.broadcast_parameters(model, root=5))
    expect_everywhere(InputMismatchError, ["root", "rank 0 passed 0", "rank 1 passed 1"],
                      lambda: hpt.broadcast_parameters(model, root=min(rank, 1)))
    assert torch.equal(model.weight, before), "a refused broadcast changed the parameters"


def check_bad_gradient_on_one_rank():
    model = torch.nn.Linear(3, 2)
    model.weight.grad = torch.ones_like(model.weight)
    model.bias.grad = torch.ones_like(model.bias)
    if rank == 1:
        model.bias.grad[0] = float("nan")
    expect_everywhere(UnsupportedInputError, ["rank 1", "bias: has NaN or Inf values"],
                      lambda: hpt.allreduce_gradients(model))
    assert torch.equal(model.weight.grad, torch.ones_like(model.weight)), "weight gradient changed"
    hpt.allreduce_gradients(model, check_finite=False)
    assert bool(torch.isnan(model.bias.grad[0])) and float(model.weight.grad[0, 0]) == 1.0
    typed = torch.nn.Linear(3, 2).to(torch.bfloat16 if rank == 1 else torch.float32)
    typed.weight.grad = torch.ones_like(typed.weight)
    expect_everywhere(UnsupportedInputError, ["rank 1", "weight: dtype torch.bfloat16 is not supported"],
                      lambda: hpt.allreduce_gradients(typed))


def check_parameter_server_dtype_on_one_rank():
    model = torch.nn.Linear(3, 2).to(torch.bfloat16 if rank == size - 1 else torch.float32)
    expect_everywhere(UnsupportedInputError, [f"rank {size - 1}", "weight has dtype torch.bfloat16"],
                      lambda: hpt.start_parameter_server(model, servers=1))


for check in (check_broadcast_root, check_bad_gradient_on_one_rank, check_parameter_server_dtype_on_one_rank):
    check()
    ctx.comm.Barrier()
    if rank == 0:
        print(f"ok {check.__name__}", flush=True)
good = torch.nn.Linear(3, 2)
good.weight.grad = torch.full_like(good.weight, float(rank))
hpt.allreduce_gradients(good)
assert np.allclose(good.weight.grad.numpy(), (size - 1) / 2), "the communicator is broken after the errors"
sys.exit(0)
