"""FSDP2 (``fully_shard``) and torch.distributed.checkpoint (DCP) on the default process group
over the backend named by argv[1]. ``save DIR``: FSDP2 trains the MLP ``STEPS`` steps, ending
within 1e-5 of torch's DDP over gloo on the same ranks; DCP saves its sharded state dict into
DIR, and rank 0 the whole parameters (``full.pt``). ``load DIR`` (any other number of ranks):
a differently initialised FSDP2 model loads DIR through DCP and holds exactly the saved
parameters. Prints "ok NAME" per check."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from hpcreduce.benchmarks.c10d_peers import (ddp_step, fresh, fsdp_step, full_parameters, largest_difference,
                                             shard, start)
from hpcreduce.benchmarks.torch_peers import MODELS

STEPS = 6

torch.set_num_threads(1)
backend, mode, folder = sys.argv[1:4]
gloo = start(backend)
rank = dist.get_rank()
saved = os.path.join(folder, "full.pt")
torch.manual_seed(0 if mode == "save" else 1)
initial = MODELS["mlp"][0]().state_dict()

if mode == "save":
    step, module = fsdp_step("mlp", initial, 16)
    reference_step, reference = ddp_step("mlp", initial, 16, gloo)
    for _ in range(STEPS):
        step()
        reference_step()
    params = full_parameters(module)
    difference = largest_difference(params, full_parameters(reference))
    assert difference <= 1e-5, f"FSDP2 is {difference:.3e} from torch DDP over gloo"
    dcp.save({"model": get_model_state_dict(module)}, checkpoint_id=folder)
    if rank == 0:
        torch.save(params, saved)
        print(f"ok fsdp2_vs_ddp {difference:.2e}\nok dcp_saved {dist.get_world_size()} ranks", flush=True)
else:
    module = shard(fresh("mlp", initial))
    state = {"model": get_model_state_dict(module)}
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(module, state["model"])
    expected, loaded = torch.load(saved), full_parameters(module)
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), f"{name} differs from the saved run's"
    if rank == 0:
        print(f"ok dcp_loaded {dist.get_world_size()} ranks", flush=True)
dist.destroy_process_group()
