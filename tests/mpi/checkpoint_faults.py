"""Checkpoints under faults and bad input, under real mpirun (2 ranks): a refused
``load_checkpoint`` leaves every rank's objects as they were (refused by rank 0's objects or by
another rank's), a foreign newest file (a tensor, a dict whose metadata is a tensor) is passed
over on every rank instead of hanging the others, and a step the file name cannot hold is
refused on every rank. Prints "ok NAME" per check. Argument: a scratch folder."""
import os
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import elastic
from hpcreduce.errors import CheckpointMismatchError, OutputFileError
from mpi_checks import expect_raised, run_checks

ctx = hpcreduce.init()
rank = ctx.rank
folder = sys.argv[1]


def tracked(seed: int, samples: int) -> elastic.State:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return elastic.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         sampler=hpt.ElasticSampler(samples), step=seed)


def check_a_refused_load_changes_nothing_on_any_rank():
    hpt.save_checkpoint(tracked(0, 9), folder, 3)
    for refusing in ([0, 1], [1]):  # every rank's sampler is over another data set; only rank 1's
        state = tracked(10 + rank, 10 if rank in refusing else 9)
        before = [p.detach().clone() for p in state.model.parameters()]
        expect_raised(CheckpointMismatchError, f"rank {refusing[-1]}: State.load_state_dict: 'sampler'",
                      lambda: hpt.load_checkpoint(state, folder), rank)
        assert all(torch.equal(a, b) for a, b in zip(before, state.model.parameters())), "the model was loaded"
        assert state.step == 10 + rank and state.sampler.consumed == 0 and not state.events


def check_a_foreign_newest_file_is_passed_over_on_every_rank():
    if rank == 0:
        torch.save(torch.zeros(3), os.path.join(folder, "ckpt-000000009.pt"))
        torch.save({"values": {}, "hpcreduce": torch.zeros(2)}, os.path.join(folder, "ckpt-000000010.pt"))
        torch.save({"values": {}, "hpcreduce": {"step": "x"}}, os.path.join(folder, "ckpt-000000011.pt"))
    ctx.comm.Barrier()
    state = tracked(10 + rank, 9)
    assert hpt.load_checkpoint(state, folder) == 3 and state.step == 0, "the checkpoint of step 3"


def check_a_step_the_name_cannot_hold_is_refused_on_every_rank():
    state = tracked(0, 9)
    for step in (-1, 10**9):
        expect_raised(OutputFileError, f"step {step} into", lambda: hpt.save_checkpoint(state, folder, step), rank)
        expect_raised(OutputFileError, "from 0 to 999999999", lambda: elastic.save_checkpoint(
            state, folder, step, {"w": np.zeros(2)}, {}), rank)
    assert sorted(os.listdir(folder))[-1] == "ckpt-000000011.pt", "nothing written"


run_checks(check_a_refused_load_changes_nothing_on_any_rank, check_a_foreign_newest_file_is_passed_over_on_every_rank,
           check_a_step_the_name_cannot_hold_is_refused_on_every_rank)
