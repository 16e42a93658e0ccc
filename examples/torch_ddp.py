"""A CNN on scikit-learn's digits, trained with hpcreduce's DDP wrapper and an elastic State.

    hpcreduce launch -n 2 --ft -- python examples/torch_ddp.py
    hpcreduce launch -n 2 --ft -- python examples/torch_ddp.py --kill-at 40 --grow-at 80

The model, the optimizer (SGD with momentum), the learning-rate schedule and the sampler
are tracked by ``hpcreduce.elastic.State``: they are committed after every step, restored in
place after a failure, and sent to a rank that joins. ``--kill-at S`` makes the rank of
stable id 1 SIGKILL itself inside step S's backward (the others' reductions fail: they go back
to their last commit and go on);
``--grow-at C`` spawns one more rank at commit C (it receives the model, the momentum buffers,
the schedule and the sampler's place in the epoch; the rest of the epoch is dealt out again).
``--compression bf16`` sends the gradients as bfloat16; ``--powersgd 4`` compresses them with
PowerSGD at rank 4 (``hpcreduce.torch.hooks``). Rank 0 prints the held-out accuracy
and every change of ranks. Needs ``pip install 'hpcreduce[torch,digits]'``.
"""
import argparse
import os
import signal

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.torch import hooks
from hpcreduce import elastic
from hpcreduce.ft.resize import GrowthRule
from hpcreduce.train.models.mlp import digits_arrays


class DigitsCNN(torch.nn.Module):
    """Two 3x3 convolutions and two linear layers on 8x8 images."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten())
        self.classify = torch.nn.Sequential(torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.classify(self.features(x))


def digits(seed: int = 0):
    """The 8x8 digits as 1-channel images in [0, 1], split 80/20 the same way on every rank."""
    pixels, labels = digits_arrays()
    order = np.random.default_rng(seed).permutation(len(labels))
    x = torch.tensor(pixels[order], dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(labels[order])
    split = len(y) * 4 // 5
    return torch.utils.data.TensorDataset(x[:split], y[:split]), (x[split:], y[split:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--compression", choices=("bf16", "fp16"), help="gradients travel as 16 bits")
    parser.add_argument("--powersgd", type=int, metavar="R", help="PowerSGD at rank R (hpcreduce.torch.hooks)")
    parser.add_argument("--kill-at", type=int, help="the rank of stable id 1 SIGKILLs itself in this step's backward")
    parser.add_argument("--grow-at", type=int, help="one rank joins at this commit")
    args = parser.parse_args()

    ctx = hpcreduce.init()
    torch.set_num_threads(1)
    torch.manual_seed(ctx.rank)  # deliberately different: the wrapper starts every rank from rank 0's
    train_set, (x_test, y_test) = digits()
    model = hpt.DistributedDataParallel(DigitsCNN(), compression=args.compression)
    if args.powersgd:
        model.register_comm_hook(hooks.PowerSGDState(None, matrix_approximation_rank=args.powersgd,
                                                     start_powerSGD_iter=10), hooks.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, args.epochs * 2 // 3), gamma=0.1)
    sampler = hpt.ElasticSampler(train_set, shuffle=True, seed=0)
    policy = elastic.Policy(growth=GrowthRule(grow=[(1, args.grow_at)])) if args.grow_at else None
    state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler, step=0,
                          policy=policy)

    @elastic.run
    def train(state):
        loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch, sampler=sampler)
        for epoch in range(sampler.epoch, args.epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad()
                logits = model(x)
                if state.step == args.kill_at and state.members.me == 1 and not ctx.joined:
                    logits.register_hook(lambda _: os.kill(os.getpid(), signal.SIGKILL))  # dies inside backward
                torch.nn.functional.cross_entropy(logits, y).backward()
                optimizer.step()
                sampler.record_batch(len(x))
                state.step += 1
                state.commit()
            scheduler.step()
            sampler.set_epoch(epoch + 1)
            state.commit()

    train(state)
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    if ctx.rank == 0:
        for event in state.events:
            print(f"change of ranks: {event}", flush=True)
        print(f"DDP wrapper on {ctx.size} ranks: held-out accuracy {accuracy:.4f} after {state.step} steps "
              f"({args.epochs} epochs)", flush=True)


if __name__ == "__main__":
    main()
