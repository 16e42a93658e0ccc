"""A PyTorch model trained data-parallel through hpcreduce: an MLP on scikit-learn's digits.

    hpcreduce launch -n 4 -- python examples/torch_digits.py          # ring AllReduce
    hpcreduce launch -n 4 -- python examples/torch_digits.py --ps     # 1 server, 3 workers

Ring: every rank starts from rank 0's weights (broadcast_parameters), computes the
gradient of its share of each global batch, averages the gradients with
allreduce_gradients and steps its own torch optimizer: all ranks stay equal.
PS (--ps): rank 0 holds the weights and runs SGD; the workers pull the weights, push
their gradients and clock each step (BSP: synchronous SGD on the global batch).
Needs ``pip install 'hpcreduce[torch,digits]'``.
"""
import argparse

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.ps import Server
from hpcreduce.train.models.mlp import digits_arrays


def digits(seed: int = 0):
    """scikit-learn's 8x8 digits, scaled to [0, 1], split 80/20 (the same on every rank)."""
    pixels, labels = digits_arrays()
    order = np.random.default_rng(seed).permutation(len(labels))
    x, y = torch.tensor(pixels[order]), torch.tensor(labels[order])
    split = len(y) * 4 // 5
    return (x[:split], y[:split]), (x[split:], y[split:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", action="store_true", help="train through a parameter server")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64, help="global batch per step")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    ctx = hpcreduce.init()
    torch.manual_seed(ctx.rank)  # deliberately different: broadcast / the servers make them equal
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    (x_train, y_train), (x_test, y_test) = digits()
    loss_fn = torch.nn.CrossEntropyLoss()
    hpt.broadcast_parameters(model)
    if args.ps:
        role = hpt.start_parameter_server(model, servers=1, optimizer="sgd", lr=args.lr)
        workers, me = ctx.size - 1, ctx.rank - 1
    else:
        role, workers, me = None, ctx.size, ctx.rank
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    if isinstance(role, Server):
        role.serve()
    else:
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(1))
        for step in range(args.steps):
            batch = order.roll(-step * args.batch)[:args.batch]  # the step's global batch
            mine = batch[me::workers]                             # this worker's share
            if role:
                role.pull()
            model.zero_grad()
            # the share's summed loss over the global batch: the shares add up to the mean
            (loss_fn(model(x_train[mine]), y_train[mine]) * len(mine) / len(batch) * workers).backward()
            if role:
                role.push()
                role.clock()
            else:
                hpt.allreduce_gradients(model)
                optimizer.step()
        if role:
            role.pull()
            role.release()
    hpt.broadcast_parameters(model, root=1 if args.ps else 0)  # a worker's final weights everywhere
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    if ctx.rank == 0:
        print(f"{'parameter server' if args.ps else 'ring allreduce'} on {ctx.size} ranks: "
              f"held-out accuracy {accuracy:.4f} after {args.steps} steps of {args.batch}", flush=True)


if __name__ == "__main__":
    main()
