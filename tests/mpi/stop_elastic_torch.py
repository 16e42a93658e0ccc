"""A torch loop in ``elastic.run(on_stop=...)`` stopped by a stop signal, then resumed (issue 37).

An MLP with SGD + momentum and a StepLR schedule, batches from ``hpcreduce.torch.ElasticSampler``
(a global batch of 12 shared by the ranks), gradients summed by ``allreduce_gradients``, all in
``elastic.State`` with the step and a count of the samples seen. The state is loaded from FOLDER
at the start (``hpcreduce.torch.load_checkpoint``). With STOP_AT >= 0, rank 1 sends itself SIGUSR1
at step STOP_AT (no other rank gets it): every rank stops at rank 0's last commit, ``on_stop``
saves the state into FOLDER and the script exits 75 (``StoppedEarly``). Run to the end, rank 0
checks, printing "ok NAME": every sample of both epochs trained exactly once over the launches,
and the parameters equal a one-process run (to summation order).
Arguments: FOLDER STOP_AT."""
import os
import signal
import sys

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import elastic
from torch_loop import CLASSES, EPOCHS, FEATURES, SEED, batches, data, one_process_run, relative_gaps, step

SAMPLES = 48
folder, stop_at = sys.argv[1], int(sys.argv[2])

ctx = hpcreduce.init()
X, Y, dataset = data(SAMPLES)


def make_model(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


model, optimizer, scheduler = make_model(100)
sampler = hpt.ElasticSampler(dataset, seed=SEED)
state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler, step=0,
                      seen=np.zeros((EPOCHS, SAMPLES), dtype=np.int64))
resumed = hpt.load_checkpoint(state, folder)
if ctx.rank == 0:
    print(f"started at step {state.step} (checkpoint {resumed})", flush=True)


@elastic.run(on_stop=lambda state: hpt.save_checkpoint(state, folder, state.step))
def train(state):
    for epoch, x, y, index, counts in batches(dataset, sampler, ctx.size):

        def reduce():
            hpt.allreduce_gradients(model, "sum")
            hpcreduce.allreduce(counts, "sum", out=counts)

        step(model, optimizer, scheduler, x, y, reduce)
        state.seen[epoch] += counts
        sampler.record_batch(len(index))
        state.step += 1
        if state.step == stop_at and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        state.commit()


train(state)
if ctx.rank == 0:
    assert (state.seen == 1).all(), state.seen
    print("ok every_sample_once", flush=True)
    reference, ref_optimizer, ref_scheduler = make_model(100)
    one_process_run(reference, ref_optimizer, ref_scheduler, X, Y)
    gaps = relative_gaps(model.parameters(), reference.parameters())
    assert max(gaps) < 1e-5 and scheduler.last_epoch == ref_scheduler.last_epoch, gaps
    print(f"ok equals_one_process_run (largest relative gap {max(gaps):.1e})", flush=True)
