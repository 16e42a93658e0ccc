"""hpcreduce.torch on 3 ranks: broadcast, averaged gradients against numpy, bad input, PS adapter.

1. broadcast_parameters: every rank builds its module from its own seed; afterwards all
   hold rank 0's parameters and buffers bit for bit.
2. allreduce_gradients: a linear model with mean squared error, each rank on its own
   equal shard of one data set; the averaged torch gradients must equal the full data
   set's gradient computed in numpy (float64) to float32 precision.
3. bad input: different shapes on one rank, and a bfloat16 gradient, raise on every rank
   (InputMismatchError, UnsupportedInputError naming the parameter), and nothing hangs.
4. PS adapter: rank 0 serves, ranks 1-2 train the linear model with BSP and SGD through
   pull/push/clock; the result equals full-batch gradient descent computed locally.
"""
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import InputMismatchError, UnsupportedInputError
from hpcreduce.ps import Server
from mpi_checks import full_batch_descent

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
failures = []
torch.set_default_dtype(torch.float32)
FEATURES, OUTPUTS, SHARD = 5, 3, 8


def check(condition, message):
    if not condition:
        failures.append(message)


def flat_state(module):
    return np.concatenate([t.detach().reshape(-1).double().numpy() for _, t in sorted(module.state_dict().items())])


# 1. broadcast: parameters and a buffer (BatchNorm's running stats and int64 counter)
torch.manual_seed(100 + rank)
module = torch.nn.Sequential(torch.nn.Linear(FEATURES, OUTPUTS), torch.nn.BatchNorm1d(OUTPUTS))
module[1].running_mean.uniform_()
module[1].num_batches_tracked += rank
hpt.broadcast_parameters(module)
states = ctx.comm.allgather(flat_state(module))
check(all(np.array_equal(states[0], s) for s in states), "broadcast: ranks differ afterwards")
torch.manual_seed(100)
reference = torch.nn.Sequential(torch.nn.Linear(FEATURES, OUTPUTS), torch.nn.BatchNorm1d(OUTPUTS))
reference[1].running_mean.uniform_()
check(np.array_equal(flat_state(module), flat_state(reference)), "broadcast: not rank 0's values")

# 2. averaged gradients against numpy on the whole data set
rng = np.random.default_rng(7)
x_all = rng.normal(size=(SHARD * size, FEATURES)).astype(np.float32)
y_all = rng.normal(size=(SHARD * size, OUTPUTS)).astype(np.float32)
torch.manual_seed(3)
linear = torch.nn.Linear(FEATURES, OUTPUTS)
mine = slice(rank * SHARD, (rank + 1) * SHARD)
loss = ((linear(torch.from_numpy(x_all[mine])) - torch.from_numpy(y_all[mine])) ** 2).mean()
loss.backward()
grad_storage = linear.weight.grad.data_ptr()
hpt.allreduce_gradients(linear)
check(linear.weight.grad.data_ptr() == grad_storage, "allreduce_gradients replaced the gradient tensor")
w, b = linear.weight.detach().double().numpy(), linear.bias.detach().double().numpy()
error = x_all @ w.T + b - y_all  # d/dW of mean((xW^T + b - y)^2) over every element
scale = 2.0 / error.size
expected_w, expected_b = scale * error.T @ x_all, scale * error.sum(axis=0)
for name, got, want in (("weight", linear.weight.grad, expected_w), ("bias", linear.bias.grad, expected_b)):
    difference = float(np.abs(got.double().numpy() - want).max() / np.abs(want).max())
    check(difference < 1e-5, f"gradients: {name} differs from numpy by {difference:.2e} (relative)")
if rank == 0:
    print(f"torch gradients equal numpy's on {size} ranks", flush=True)

# 3. bad input, raised on every rank
odd = torch.nn.Linear(FEATURES + (rank == size - 1), OUTPUTS)
for what, call in (("broadcast", lambda: hpt.broadcast_parameters(odd)),
                   ("gradients", lambda: hpt.allreduce_gradients(odd))):
    try:
        call()
        failures.append(f"{what} of different shapes did not raise")
    except InputMismatchError as err:
        check(what != "broadcast" or f"rank {size - 1}" in str(err), f"{what}: message {err}")
half = torch.nn.Linear(2, 2).to(torch.bfloat16)
half.weight.grad = torch.ones_like(half.weight)
try:
    hpt.allreduce_gradients(half)
    failures.append("a bfloat16 gradient did not raise")
except UnsupportedInputError as err:
    check("weight: dtype torch.bfloat16 is not supported" in str(err), f"bfloat16 message: {err}")

# 4. the PS adapter against full-batch gradient descent (SGD, lr 0.1, BSP)
LR, STEPS = 0.1, 4
torch.manual_seed(11)
model = torch.nn.Linear(FEATURES, OUTPUTS)
expected = full_batch_descent(model, torch.from_numpy(x_all), torch.from_numpy(y_all), LR, STEPS)
role = hpt.start_parameter_server(model, servers=1, optimizer="sgd", lr=LR)
if isinstance(role, Server):
    role.serve()
else:
    worker_id, workers = rank - 1, size - 1
    shard = slice(worker_id * SHARD * size // workers, (worker_id + 1) * SHARD * size // workers)
    for _ in range(STEPS):
        role.pull()
        model.zero_grad()
        ((model(torch.from_numpy(x_all[shard])) - torch.from_numpy(y_all[shard])) ** 2).mean().backward()
        role.push()
        role.clock()
    role.pull()
    role.release()
    for (name, got), want in zip(model.state_dict().items(), expected.state_dict().values()):
        difference = float((got - want).abs().max() / want.abs().max())
        check(difference < 1e-5, f"PS: {name} differs from full-batch descent by {difference:.2e}")

for failure in failures:
    print(f"rank {rank}: FAIL {failure}", flush=True)
total = ctx.comm.allreduce(len(failures))
if rank == 0 and not total:
    print("torch interop: all checks passed", flush=True)
sys.exit(1 if total else 0)
