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
import torch.nn.functional as F

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import elastic

SAMPLES, FEATURES, CLASSES, BATCH, EPOCHS, SEED = 48, 10, 3, 12, 2, 5
folder, stop_at = sys.argv[1], int(sys.argv[2])

ctx = hpcreduce.init()
generator = torch.Generator().manual_seed(0)
X = torch.randn(SAMPLES, FEATURES, generator=generator)
Y = (X[:, :CLASSES] * torch.tensor([1.0, -2.0, 0.5])).argmax(dim=1)
dataset = torch.utils.data.TensorDataset(X, Y, torch.arange(SAMPLES))


def make_model(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


def step(model, optimizer, scheduler, x, y, reduce) -> None:
    optimizer.zero_grad()
    (F.cross_entropy(model(x), y, reduction="sum") / BATCH).backward()
    reduce()
    optimizer.step()
    scheduler.step()


model, optimizer, scheduler = make_model(100)
sampler = hpt.ElasticSampler(dataset, seed=SEED)
state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler, step=0,
                      seen=np.zeros((EPOCHS, SAMPLES), dtype=np.int64))
resumed = hpt.load_checkpoint(state, folder)
if ctx.rank == 0:
    print(f"started at step {state.step} (checkpoint {resumed})", flush=True)


@elastic.run(on_stop=lambda state: hpt.save_checkpoint(state, folder, state.step))
def train(state):
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH // ctx.size, sampler=sampler)
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for x, y, index in loader:
            counts = np.bincount(index.numpy(), minlength=SAMPLES).astype(np.int64)

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
    for epoch in range(EPOCHS):
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch))
        for start in range(0, SAMPLES, BATCH):
            batch = order[start:start + BATCH]
            step(reference, ref_optimizer, ref_scheduler, X[batch], Y[batch], lambda: None)
    with torch.no_grad():
        gaps = [float((p - r).abs().max() / r.abs().max()) for p, r in zip(model.parameters(), reference.parameters())]
    assert max(gaps) < 1e-5 and scheduler.last_epoch == ref_scheduler.last_epoch, gaps
    print(f"ok equals_one_process_run (largest relative gap {max(gaps):.1e})", flush=True)
