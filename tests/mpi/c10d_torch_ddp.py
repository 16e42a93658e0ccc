"""torch's own DDP and HSDP (FSDP2 on a 2-D DeviceMesh) on the default process group over the
backend named by argv[1] (the tensors on argv[2]'s device, default cpu; cuda: bench/gpu_check.sh), against torch's DDP over gloo on the same ranks in the same run:
the parameters after ``STEPS`` steps agree (1e-5; 1e-4 on the CNN, whose max-pooling
amplifies another summation order) and are the same on every rank. The HSDP check needs 4
ranks (2 replicas of 2 shards). Prints "ok NAME difference" per check."""
import sys

import torch
import torch.distributed as dist

from hpcreduce.benchmarks.c10d_peers import (ddp_step, fsdp_step, full_parameters, largest_difference,
                                             start)
from hpcreduce.benchmarks.torch_peers import MODELS

STEPS = 8
BOUND = {"mlp": 1e-5, "cnn": 1e-4}

torch.set_num_threads(1)
backend, device = sys.argv[1], (sys.argv[2:] or ["cpu"])[0]
gloo = start(backend)
rank = dist.get_rank()


def initial(model: str):
    torch.manual_seed(0)
    return MODELS[model][0]().state_dict()


def same_on_every_rank(params) -> bool:
    flat = torch.cat([p.reshape(-1) for p in params.values()]).cpu()
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat, group=gloo)
    return all(torch.equal(flat, copy) for copy in copies)


def compare(name: str, ours, theirs, bound: float) -> None:
    for _ in range(STEPS):
        ours[0]()
        theirs[0]()
    mine, reference = full_parameters(ours[1]), full_parameters(theirs[1])
    difference = torch.tensor(largest_difference(mine, reference))
    dist.all_reduce(difference, op=dist.ReduceOp.MAX, group=gloo)
    assert same_on_every_rank(mine), f"{name}: the ranks' parameters differ"
    assert difference <= bound, f"{name}: {float(difference):.3e} from torch DDP over gloo (bound {bound})"
    if rank == 0:
        print(f"ok {name} {float(difference):.2e}", flush=True)


for model in ("mlp", "cnn"):
    state, batch = initial(model), 16
    compare(f"ddp_{model}", ddp_step(model, state, batch, device=device),
            ddp_step(model, state, batch, gloo, device), BOUND[model])
if dist.get_world_size() == 4:
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device, (2, 2), mesh_dim_names=("replicate", "shard"))
    state = initial("mlp")
    compare("hsdp_mlp", fsdp_step("mlp", state, 16, mesh, device), ddp_step("mlp", state, 16, gloo, device),
            BOUND["mlp"])
dist.destroy_process_group()
