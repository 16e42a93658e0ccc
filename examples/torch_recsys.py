"""A DLRM-like click model trained hybrid: embedding tables on parameter servers, dense MLPs allreduced.

    mpirun -n 4 python examples/torch_recsys.py --servers 1        # 1 server, 3 workers
    hpcreduce launch -n 6 -- python examples/torch_recsys.py --servers 2 --consistency bsp

Each example has a few dense features and ``--hot`` ids in each of ``--fields`` categorical
fields. The model (DLRM's shape): a bottom MLP embeds the dense features, one
``PSEmbeddingBag`` per field pools its ids (the tables live on the servers, which train them
with Adagrad; dynamic tables, a row made when its id first arrives, or ``--fixed`` ones), the pairwise dot products of those vectors and the bottom's output go to a
top MLP that gives the click logit. ``hpcreduce.torch.start_hybrid`` puts the tables on
ranks 0..servers-1 and wraps the rest in ``DistributedDataParallel`` over the workers, as
PERSIA trains. The clicks come from ``Clicks``: a known factorisation-machine truth over
Zipf-popular ids, so the truth's own held-out loss is printed as the floor; any data with
its ``batches(stream, size)`` and batch layout can replace it.
"""
import argparse
from typing import Iterator, Optional, Tuple

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.ps import Server

DENSE_FEATURES, TRUE_DIM, HELD_OUT = 4, 4, 4096
Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # dense float32 (b, 4), ids int64 (b, fields, hot), labels (b,)


class Clicks:
    """Synthetic clicks with a known truth. Field f's ids have popularity ~ 1/id over
    [0, vocab); the true logit is the sum over field pairs of the dot products of the fields'
    pooled true vectors, plus a linear term of the dense features; labels are drawn from it.
    The truth is the same on every rank; ``batches(stream, size)`` differ by stream."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        truth = np.random.default_rng([args.seed, 0])
        scale = (4.0 / (args.fields * (args.fields - 1) / 2 * TRUE_DIM)) ** 0.25 / np.sqrt(args.hot)
        self.vectors = truth.normal(0, scale, (args.fields, args.vocab, TRUE_DIM)).astype(np.float32)
        self.dense_weights = truth.normal(0, 0.5, DENSE_FEATURES).astype(np.float32)

    def logit(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The true logit of each example."""
        pooled = self.vectors[np.arange(self.args.fields)[None, :, None], ids].sum(axis=2)  # (b, fields, k)
        gram = np.einsum("bfk,bgk->bfg", pooled, pooled)
        return (gram.sum(axis=(1, 2)) - np.einsum("bff->b", gram)) / 2 + dense @ self.dense_weights

    def batches(self, stream: int, size: int) -> Iterator[Batch]:
        """Endless batches of ``size`` examples of stream ``stream`` (a worker's index; -1: held out)."""
        args = self.args
        rng = np.random.default_rng([args.seed, 1, stream + 1])
        while True:
            dense = rng.normal(size=(size, DENSE_FEATURES)).astype(np.float32)
            ids = (args.vocab ** rng.random((size, args.fields, args.hot))).astype(np.int64) - 1
            labels = (rng.random(size) < 1 / (1 + np.exp(-self.logit(dense, ids)))).astype(np.float32)
            yield torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(labels)


def mlp(*widths: int) -> torch.nn.Sequential:
    layers = []
    for into, out in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(into, out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class DLRM(torch.nn.Module):
    """Bottom MLP, one PSEmbeddingBag per field (``rows`` None: dynamic tables, keyed by any
    int64 id; else fixed tables of ``rows`` rows), dot interactions, top MLP."""

    def __init__(self, fields: int, rows: Optional[int], dim: int, hidden: int):
        super().__init__()
        self.bottom = mlp(DENSE_FEATURES, hidden, dim)
        self.bags = torch.nn.ModuleList(hpt.PSEmbeddingBag(f"field{f}", dim, rows, mode="sum", init_scale=0.1)
                                        for f in range(fields))
        pairs = (fields + 1) * fields // 2
        self.top = mlp(dim + pairs, hidden, 1)
        self.upper = torch.triu_indices(fields + 1, fields + 1, offset=1)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        fields = ids.unbind(dim=1)                 # (b, hot) per field
        for bag, field_ids in zip(self.bags, fields):
            bag.prefetch(field_ids)                # every table's pull in flight at once
        bottom = self.bottom(dense)
        vectors = torch.stack([bottom] + [bag(field_ids) for bag, field_ids in zip(self.bags, fields)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        return self.top(torch.cat([bottom, dots], dim=1)).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--consistency", choices=("bsp", "ssp", "asp"), default="ssp")
    parser.add_argument("--staleness", type=int, default=2, help="ssp's bound, in steps")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=256, help="examples per worker per step")
    parser.add_argument("--fields", type=int, default=4)
    parser.add_argument("--hot", type=int, default=2, help="ids per field per example")
    parser.add_argument("--vocab", type=int, default=1000, help="ids per field")
    parser.add_argument("--fixed", action="store_true",
                        help="fixed tables of --vocab rows (default: dynamic tables, rows made as ids arrive)")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.3, help="the servers' Adagrad rate for the tables")
    parser.add_argument("--dense-lr", type=float, default=0.01, help="Adam's rate for the dense layers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    ctx = hpcreduce.init()
    torch.manual_seed(args.seed)
    model = DLRM(args.fields, args.vocab if args.fixed else None, args.dim, args.hidden)
    job = hpt.start_hybrid(model, servers=args.servers, consistency=args.consistency,
                           staleness=args.staleness if args.consistency == "ssp" else 0,
                           optimizer="adagrad", lr=args.lr, seed=args.seed)
    if isinstance(job, Server):
        job.serve()
        return
    loss_fn = torch.nn.BCEWithLogitsLoss()
    data = Clicks(args)
    test_dense, test_ids, test_labels = next(data.batches(-1, HELD_OUT))
    floor = loss_fn(torch.from_numpy(data.logit(test_dense.numpy(), test_ids.numpy())), test_labels).item()

    def held_out_loss() -> float:
        with torch.no_grad():
            return loss_fn(job.module(test_dense, test_ids), test_labels).item()
    before = held_out_loss()
    optimizer = torch.optim.Adam(job.module.parameters(), lr=args.dense_lr)
    for step, (dense, ids, labels) in zip(range(args.steps), data.batches(job.comm.Get_rank(), args.batch)):
        optimizer.zero_grad()
        loss_fn(job.module(dense, ids), labels).backward()    # dense gradients averaged over workers
        job.push()                                            # row gradients to the servers
        optimizer.step()
        job.clock()
    after = held_out_loss()
    job.release()
    if job.comm.Get_rank() == 0:
        workers = job.comm.Get_size()
        print(f"hybrid on {ctx.size} ranks ({args.servers} servers, {workers} workers, {args.consistency}): "
              f"held-out loss {before:.4f} -> {after:.4f} after {args.steps} steps of {workers}x{args.batch} "
              f"(the truth's: {floor:.4f})", flush=True)


if __name__ == "__main__":
    main()
