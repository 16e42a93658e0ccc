"""hpcreduce.elastic with torch objects, and hpcreduce.torch's sampler and checkpoints, under
real mpirun (3 ranks, no failures): sync into the same objects (a rank's empty optimizer gets
rank 0's momentum buffers), another model refused on every rank naming the parameter,
RandomStates, a dict of named parameters, ElasticSampler against DistributedSampler, and
checkpoints written on rank 0 that plain ``torch.load`` reads. Prints "ok NAME" per check
(``mpi_checks.run_checks``). Argument: a scratch folder."""
import os
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import elastic
from hpcreduce.errors import CheckpointMismatchError, InputMismatchError, OutputFileError
from mpi_checks import expect_raised, run_checks

ctx = hpcreduce.init()
rank = ctx.rank
folder = sys.argv[1]


def same_everywhere(tensor: torch.Tensor) -> bool:
    values = tensor.detach().numpy()
    return all(np.array_equal(values, other) for other in ctx.comm.allgather(values))


def trained(seed: int, steps: int):
    """A model, its SGD with momentum and a StepLR after ``steps`` local steps on seeded data."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def check_sync_in_place_and_lazy_optimizer_state():
    model, optimizer, scheduler = trained(rank, 0 if rank == 1 else 3)  # rank 1: a newcomer, no momentum yet
    params = list(model.parameters())
    state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler)
    state.sync()
    assert all(a is b for a, b in zip(optimizer.param_groups[0]["params"], params)), "the live parameters"
    assert state.model is model and state.optimizer is optimizer, "synced into the same objects"
    assert len(optimizer.state) == len(params), f"rank {rank}: {len(optimizer.state)} momentum buffers"
    for param in params:
        assert same_everywhere(param) and same_everywhere(optimizer.state[param]["momentum_buffer"])
    assert scheduler.last_epoch == 3 and optimizer.param_groups[0]["lr"] == 0.05, scheduler.state_dict()
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()  # steps the live parameters with the synced momentum: still equal everywhere
    assert all(same_everywhere(param) for param in params)


def check_another_model_is_refused_on_every_rank():
    model = torch.nn.Linear(4 if rank != 2 else 5, 3)
    state = elastic.State(model=model)
    before = model.weight.detach().clone()
    expect_raised(InputMismatchError, "rank 2: 'model': 'weight' has shape (3, 5) float32 here, (3, 4) float32 "
                  "on rank 0", state.sync, rank)
    assert torch.equal(model.weight, before), "nothing overwritten"
    optimizer = torch.optim.SGD([model.weight] if rank == 1 else model.parameters(), lr=0.1)
    state = elastic.State(optimizer=optimizer)
    expect_raised(InputMismatchError, "rank 1: 'optimizer': 'param_groups.0.params.1' on rank 0 is missing here",
                  state.sync, rank)


def check_random_states_and_dotted_names():
    torch.manual_seed(10 + rank)
    np.random.seed(10 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    state = elastic.State(rng=elastic.RandomStates(), params=dict(model.named_parameters()))
    first = torch.rand(2), np.random.rand(2)
    state.restore()
    assert torch.equal(torch.rand(2), first[0]) and np.array_equal(np.random.rand(2), first[1]), "restored"
    state.sync()
    assert same_everywhere(torch.rand(3)) and same_everywhere(torch.from_numpy(np.random.rand(3))), "rank 0's"
    assert same_everywhere(model[0].weight) and state.params["0.weight"] is model[0].weight


def check_sampler_shares_like_distributed_sampler_and_reshards():
    sampler = hpt.ElasticSampler(23, seed=4)
    sampler.set_epoch(2)
    reference = torch.utils.data.DistributedSampler(range(23), num_replicas=ctx.size, rank=rank, seed=4)
    reference.set_epoch(2)
    assert list(sampler) == list(reference) and len(sampler) == len(reference) == 8
    sampler.record_batch(3)  # every rank took 3: the job consumed the order's first 9
    rest = sampler.order()[9:]
    shares = ctx.comm.allgather(list(sampler))
    assert sorted(i for share in shares for i in share[:len(rest) // ctx.size]) == sorted(rest[:12])
    assert [len(share) for share in shares] == [5, 5, 5], "14 left: padded to 15"
    sampler.set_epoch(2)
    assert sampler.consumed == 9, "the same epoch again changes nothing"
    expect_raised(ValueError, "length 23, this one has length 24", lambda: hpt.ElasticSampler(24).load_state_dict(
        sampler.state_dict()), rank)


def check_checkpoints_torch_load_reads():
    model, optimizer, scheduler = trained(0, 3)
    state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler, sampler=hpt.ElasticSampler(9),
                          step=3, weights=np.arange(4.0))
    path = hpt.save_checkpoint(state, folder, 3, identity={"lr": 0.1})
    stored = torch.load(path, weights_only=True)  # plain torch
    assert stored["hpcreduce"]["step"] == 3 and stored["hpcreduce"]["identity"]["lr"] == 0.1
    assert torch.equal(stored["values"]["model"]["0.weight"], model[0].weight)
    assert torch.equal(stored["values"]["weights"], torch.arange(4.0, dtype=torch.float64))
    fresh, fresh_optimizer, fresh_scheduler = trained(1 + rank, 0)
    resumed = elastic.State(model=fresh, optimizer=fresh_optimizer, scheduler=fresh_scheduler,
                            sampler=hpt.ElasticSampler(9), step=0, weights=np.zeros(4))
    assert hpt.load_checkpoint(resumed, folder, identity={"lr": 0.1}) == 3 and resumed.step == 3
    assert torch.equal(fresh[0].weight, model[0].weight) and fresh_scheduler.last_epoch == 3
    assert torch.equal(fresh_optimizer.state[fresh[0].weight]["momentum_buffer"],
                       optimizer.state[model[0].weight]["momentum_buffer"])
    assert resumed.weights.tolist() == [0.0, 1.0, 2.0, 3.0] and resumed.events[-1]["kind"] == "resume"
    expect_raised(CheckpointMismatchError, "was written by a run with lr 0.1, this run has lr 0.2",
                  lambda: hpt.load_checkpoint(resumed, folder, identity={"lr": 0.2}), rank)
    blocked = os.path.join(folder, "a-file")
    if rank == 0:
        open(blocked, "w").close()
    ctx.comm.Barrier()
    expect_raised(OutputFileError, "a-file", lambda: hpt.save_checkpoint(state, blocked, 4), rank)


run_checks(check_sync_in_place_and_lazy_optimizer_state, check_another_model_is_refused_on_every_rank,
           check_random_states_and_dotted_names, check_sampler_shares_like_distributed_sampler_and_reshards,
           check_checkpoints_torch_load_reads)
