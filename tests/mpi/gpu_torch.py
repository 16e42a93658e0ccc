"""hpcreduce.torch on CUDA tensors (needs torch with CUDA and cupy), ranks sharing the GPU(s).

On this launch's path (HPCREDUCE_CUDA_AWARE=0: staged through host copies; CUDA-aware MPI:
device memory handed to MPI): ``broadcast_parameters`` gives every rank rank 0's CUDA
parameters bit for bit; ``allreduce_gradients`` averages CUDA gradients in place to the
CPU computation's values, and so does ``DistributedDataParallel`` (float32, a bf16 wire, a
bfloat16 model); the PS adapter pulls into and pushes from CUDA parameters and
matches full-batch gradient descent computed on the CPU. GPU_TEST_PATH as gpu_allreduce.py.
"""
import os
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.collectives.transfer import transfer_kind
from hpcreduce.ps import Server
from hpcreduce.runtime.devices import select_device
from mpi_checks import full_batch_descent

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
if not torch.cuda.is_available():
    if rank == 0:
        print("skip: torch does not see a CUDA device")
    sys.exit(0)
path = transfer_kind(True, ctx.cuda_aware)
if os.environ.get("GPU_TEST_PATH", "staged") == "direct" and path != "device":
    if rank == 0:
        print("skip: this MPI is not CUDA-aware (its MPIX query says no), so there is no direct path")
    sys.exit(0)
device = torch.device("cuda", select_device())
failures = []
FEATURES, OUTPUTS, SHARD, LR, STEPS = 6, 4, 8, 0.1, 3


def check(condition, message):
    if not condition:
        failures.append(message)


torch.manual_seed(100 + rank)
module = torch.nn.Linear(FEATURES, OUTPUTS).to(device)
hpt.broadcast_parameters(module)
mine = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).cpu().numpy()
check(all(np.array_equal(mine, theirs) for theirs in ctx.comm.allgather(mine)), "broadcast: ranks differ")

rng = np.random.default_rng(7)
x_all = torch.from_numpy(rng.normal(size=(SHARD * size, FEATURES)).astype(np.float32))
y_all = torch.from_numpy(rng.normal(size=(SHARD * size, OUTPUTS)).astype(np.float32))
torch.manual_seed(3)
on_cpu = torch.nn.Linear(FEATURES, OUTPUTS)
on_gpu = torch.nn.Linear(FEATURES, OUTPUTS).to(device)
on_gpu.load_state_dict(on_cpu.state_dict())
shard = slice(rank * SHARD, (rank + 1) * SHARD)
((on_gpu(x_all[shard].to(device)) - y_all[shard].to(device)) ** 2).mean().backward()
hpt.allreduce_gradients(on_gpu)
((on_cpu(x_all) - y_all) ** 2).mean().backward()
for (name, got), want in zip(on_gpu.named_parameters(), on_cpu.parameters()):
    check(got.grad.is_cuda, f"gradients: {name}'s gradient left the GPU")
    difference = float((got.grad.cpu() - want.grad).abs().max() / want.grad.abs().max())
    check(difference < 1e-5, f"gradients: {name} differs from the CPU's by {difference:.2e}")

for compression, dtype, tolerance in ((None, torch.float32, 1e-5), ("bf16", torch.float32, 2e-2),
                                     (None, torch.bfloat16, 3e-2)):
    torch.manual_seed(5)
    reference = torch.nn.Linear(FEATURES, OUTPUTS)
    wrapped = torch.nn.Linear(FEATURES, OUTPUTS).to(device, dtype)
    wrapped.load_state_dict(reference.state_dict())
    ddp = hpt.DistributedDataParallel(wrapped, bucket_cap_mb=1e-4, compression=compression)
    ((ddp(x_all[shard].to(device, dtype)) - y_all[shard].to(device, dtype)) ** 2).mean().backward()
    ((reference(x_all) - y_all) ** 2).mean().backward()
    for (name, got), want in zip(wrapped.named_parameters(), reference.parameters()):
        check(got.grad.is_cuda and got.grad.dtype == dtype, f"DDP {compression} {dtype}: {name}'s gradient moved")
        difference = float((got.grad.float().cpu() - want.grad).abs().max() / want.grad.abs().max())
        check(difference < tolerance, f"DDP {compression} {dtype}: {name} differs from the CPU's by {difference:.2e}")

torch.manual_seed(11)
start = torch.nn.Linear(FEATURES, OUTPUTS)
model = torch.nn.Linear(FEATURES, OUTPUTS).to(device)
model.load_state_dict(start.state_dict())
expected = full_batch_descent(start, x_all, y_all, LR, STEPS)
role = hpt.start_parameter_server(model, servers=1, optimizer="sgd", lr=LR)
if isinstance(role, Server):
    role.serve()
else:
    workers = size - 1
    part = slice((rank - 1) * SHARD * size // workers, rank * SHARD * size // workers)
    for _ in range(STEPS):
        role.pull()
        model.zero_grad()
        ((model(x_all[part].to(device)) - y_all[part].to(device)) ** 2).mean().backward()
        role.push()
        role.clock()
    role.pull()
    role.release()
    for (name, got), want in zip(model.state_dict().items(), expected.state_dict().values()):
        check(got.is_cuda, f"PS: {name} left the GPU")
        difference = float((got.cpu() - want).abs().max() / want.abs().max())
        check(difference < 1e-5, f"PS: {name} differs from full-batch descent by {difference:.2e}")

for failure in failures:
    print(f"rank {rank}: FAIL {failure}", flush=True)
total = ctx.comm.allreduce(len(failures))
if rank == 0 and not total:
    print(f"torch on CUDA ({path}): all checks passed", flush=True)
sys.exit(1 if total else 0)
