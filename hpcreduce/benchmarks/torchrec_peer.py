"""TorchRec on CPU as a peer of ``bench embeddings --parts peers``: the DLRM's tables in one
``EmbeddingBagCollection``, sharded table-wise (each table whole on one rank: the one sharding
that runs on CPU) by ``DistributedModelParallel`` over a process group (the default one: gloo's in ``bench
embeddings``; ``bench c10d`` runs it over "hpcreduce" and a gloo group side by side), the
dense layers data-parallel; the tables' SGD fused into backward, the dense layers' after it.

Install (not a dependency of hpcreduce; see bench/embeddings.sh): ``pip install torchrec``,
then ``pip install --no-deps --force-reinstall fbgemm-gpu-cpu`` (torchrec pulls the CUDA
``fbgemm-gpu``, which does not import without CUDA); both must be built for the installed
torch (fbgemm-gpu-cpu 1.9.0 is for torch 2.9).
"""
from __future__ import annotations

import importlib
from typing import Callable, Optional, Tuple

import torch

from .dlrm import DLRM, CollectionBags, Shape, jagged


def import_problem() -> Optional[str]:
    """Why TorchRec cannot run here (None: it imports, fbgemm's CPU operators included)."""
    try:
        importlib.import_module("torchrec.distributed")  # loads fbgemm_gpu's operator libraries
    except Exception as err:  # ImportError, or OSError from an fbgemm library built for another torch
        return f"torchrec does not import: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return None


def build(shape: Shape, batch, lr: float, group=None) -> Tuple[Callable[[int], None], int, Callable[[], float]]:
    """``steps(n)`` of the sharded model on ``batch``, the dense parameters' element count, and
    the last step's loss; sharded over ``group`` (None: the default process group)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv, ShardingType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    import torchrec
    model = DLRM(CollectionBags(shape, torchrec, device=torch.device("meta")), shape)
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse.parameters(), {"lr": lr})
    world = torch.distributed.get_world_size(group)
    constraints = {f"t{field}": ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
                   for field in range(shape.fields)}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"),
                                       constraints=constraints)
    sharders = [EmbeddingBagCollectionSharder()]
    plan = planner.collective_plan(model, sharders, group)
    env = None if group is None else ShardingEnv.from_process_group(group)
    sharded = DistributedModelParallel(model, env=env, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense_params = dict(in_backward_optimizer_filter(sharded.named_parameters()))
    optimizer = KeyedOptimizerWrapper(dense_params, lambda params: torch.optim.SGD(params, lr=lr))
    dense, ids, labels = batch
    features = jagged(ids, torchrec)
    losses = [float("nan")]

    def steps(count: int) -> None:
        for _ in range(count):
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(sharded(dense, features), labels)
            loss.backward()
            optimizer.step()
            losses[0] = float(loss.detach())
    return steps, sum(p.numel() for p in dense_params.values()), lambda: losses[0]
