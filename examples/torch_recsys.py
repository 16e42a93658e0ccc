"""A DLRM-like click model trained hybrid: embedding tables on parameter servers, dense MLPs allreduced.

    mpirun -n 4 python examples/torch_recsys.py --servers 1        # 1 server, 3 workers
    hpcreduce launch -n 6 -- python examples/torch_recsys.py --servers 2 --consistency bsp

Each example has a few dense features and ``--hot`` ids in each of ``--fields`` categorical
fields. The model (DLRM's shape): a bottom MLP embeds the dense features, an
``EmbeddingBagCollection`` with a table per field pools its ids (TorchRec's names; the tables
live on the servers, which train them with ``RowOptimizer("adagrad", --lr)``; dynamic tables,
a row made when its id first arrives, or ``--fixed`` ones), the pairwise dot products of those
vectors and the bottom's output go to a top MLP that gives the click logit. ``hpcreduce.torch.start_hybrid`` puts the tables on
ranks 0..servers-1 and wraps the rest in ``DistributedDataParallel`` over the workers, as
PERSIA trains. The clicks come from ``Clicks``: a known factorisation-machine truth over
Zipf-popular ids, so the truth's own held-out loss is printed as the floor; any data with
its ``batches(stream, size)`` and batch layout can replace it.

``--ft-trainer`` trains the same module with fault tolerance instead: ``hpcreduce.torch.TorchModel``
makes it a ``hpcreduce.train`` model, and ``hpcreduce.train.train`` runs it with ``Hybrid``
(the tables on the servers, the dense parameters replicated on the workers and allreduced;
one optimizer, ``adagrad`` at ``--lr``, for both) on ``--examples`` drawn clicks. Under a ULFM
launch a SIGKILLed worker or server is survived (``--kill RANK@STEP`` injects one; ``--replace``
spawns a successor):

    hpcreduce launch --ft -n 5 -- python examples/torch_recsys.py --servers 2 --ft-trainer --kill 4@20
"""
import argparse
from typing import Iterator, Optional, Tuple

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce.ft.faults import FaultConfig
from hpcreduce.ft.inject import parse_kill
from hpcreduce.ps import Server
from hpcreduce.train import ArrayDataset, Hybrid, TrainConfig, train

DENSE_FEATURES, TRUE_DIM, HELD_OUT = 4, 4, 4096
FT_STREAM = 1 << 20  # past any worker's index
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

    def draw(self, stream: int, size: int) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Endless (dense, ids, labels) numpy batches of ``size`` examples of stream ``stream``
        (a worker's index; -1: held out; ``FT_STREAM``: the ``--ft-trainer``'s training examples)."""
        args = self.args
        rng = np.random.default_rng([args.seed, 1, stream + 1])
        while True:
            dense = rng.normal(size=(size, DENSE_FEATURES)).astype(np.float32)
            ids = (args.vocab ** rng.random((size, args.fields, args.hot))).astype(np.int64) - 1
            labels = (rng.random(size) < 1 / (1 + np.exp(-self.logit(dense, ids)))).astype(np.float32)
            yield dense, ids, labels

    def batches(self, stream: int, size: int) -> Iterator[Batch]:
        """``draw``'s batches as torch tensors."""
        for arrays in self.draw(stream, size):
            yield tuple(torch.from_numpy(array) for array in arrays)

    def dataset(self, examples: int) -> ArrayDataset:
        """``examples`` training clicks and the held-out ones, as ``hpcreduce.train`` reads data."""
        names = ("dense", "ids", "label")
        return ArrayDataset("clicks", dict(zip(names, next(self.draw(FT_STREAM, examples)))),
                            dict(zip(names, next(self.draw(-1, HELD_OUT)))))


def mlp(*widths: int) -> torch.nn.Sequential:
    layers = []
    for into, out in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(into, out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def features(ids: torch.Tensor) -> hpt.KeyedJaggedTensor:
    """ids (b, fields, hot) as a KeyedJaggedTensor: feature ``field{f}``'s bags, key-major."""
    batch, fields, hot = ids.shape
    return hpt.KeyedJaggedTensor([f"field{f}" for f in range(fields)], ids.permute(1, 0, 2).reshape(-1),
                                 lengths=torch.full((fields * batch,), hot, dtype=torch.int64))


class DLRM(torch.nn.Module):
    """Bottom MLP, an EmbeddingBagCollection of one table per field (``rows`` None: dynamic
    tables, keyed by any int64 id; else fixed tables of ``rows`` rows), dot interactions, top MLP."""

    def __init__(self, fields: int, rows: Optional[int], dim: int, hidden: int):
        super().__init__()
        self.fields, self.dim = fields, dim
        self.bottom = mlp(DENSE_FEATURES, hidden, dim)
        bound = 0.1 * 3 ** 0.5  # rows start with standard deviation 0.1
        self.sparse = hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(
            rows, dim, name=f"field{f}", feature_names=[f"field{f}"], weight_init_min=-bound, weight_init_max=bound)
            for f in range(fields)])
        pairs = (fields + 1) * fields // 2
        self.top = mlp(dim + pairs, hidden, 1)
        self.upper = torch.triu_indices(fields + 1, fields + 1, offset=1)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom(dense)
        pooled = self.sparse(features(ids)).values().view(-1, self.fields, self.dim)  # one pull for every table
        vectors = torch.cat([bottom.unsqueeze(1), pooled], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        return self.top(torch.cat([bottom, dots], dim=1)).squeeze(1)


def click_loss(model: DLRM, batch) -> Tuple[torch.Tensor, int, int]:
    """``TorchModel``'s loss: summed log-loss of a batch of ``Clicks.dataset``, correct clicks, examples."""
    logits = model(torch.from_numpy(batch["dense"]), torch.from_numpy(batch["ids"]))
    labels = torch.from_numpy(batch["label"])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    return loss, int(((logits > 0) == (labels > 0.5)).sum()), len(labels)


def train_fault_tolerant(args: argparse.Namespace, model: DLRM, ctx) -> None:
    """``--ft-trainer``: the module trained by ``hpcreduce.train``'s hybrid trainer (recovers from kills)."""
    data = Clicks(args)
    adapted = hpt.TorchModel(model, click_loss, lambda batch: features(torch.from_numpy(batch["ids"])),
                             name="dlrm", seed=args.seed)
    workers = ctx.size - args.servers
    config = TrainConfig(model="dlrm", steps=args.steps, batch=args.batch * workers, lr=args.lr,
                         optimizer="adagrad", seed=args.seed, progress="none", json_path=args.json,
                         topology=Hybrid(servers=args.servers, consistency=args.consistency,
                                         staleness=args.staleness if args.consistency == "ssp" else 0),
                         fault=FaultConfig(kills=args.kill or [], replace=args.replace))
    result = train(adapted, data.dataset(args.examples), config, comm=ctx, verbose=False)
    if ctx.rank == 0:
        lost = [event["lost"] for event in result.recovery or [] if event["kind"] == "failure"]
        print(f"hybrid (fault-tolerant trainer) on {ctx.size} ranks ({args.servers} servers): held-out loss "
              f"{result.start['loss']:.4f} -> {result.final.loss:.4f} after {args.steps} steps; ranks lost "
              f"{lost}; dense replicas identical: {result.ps['hybrid']['dense_identical']}", flush=True)


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
    parser.add_argument("--lr", type=float, help="Adagrad's rate for the tables on the servers (default 0.3); "
                        "--ft-trainer: for the dense parameters too (default 0.05)")
    parser.add_argument("--dense-lr", type=float, default=0.01, help="Adam's rate for the dense layers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ft-trainer", action="store_true",
                        help="train with hpcreduce.train's fault-tolerant hybrid trainer (TorchModel)")
    parser.add_argument("--examples", type=int, default=200_000, help="--ft-trainer: training clicks drawn")
    parser.add_argument("--kill", type=parse_kill, action="append", metavar="RANK@STEP",
                        help="--ft-trainer: SIGKILL rank RANK at step STEP (launch with ULFM); repeatable")
    parser.add_argument("--replace", action="store_true", help="--ft-trainer: spawn a successor for a lost rank")
    parser.add_argument("--json", help="--ft-trainer: write the run's result here")
    args = parser.parse_args()
    args.lr = args.lr or (0.05 if args.ft_trainer else 0.3)

    ctx = hpcreduce.init()
    torch.manual_seed(args.seed)
    model = DLRM(args.fields, args.vocab if args.fixed else None, args.dim, args.hidden)
    if args.ft_trainer:
        train_fault_tolerant(args, model, ctx)
        return
    job = hpt.start_hybrid(model, sparse_optimizer=hpt.RowOptimizer("adagrad", lr=args.lr), servers=args.servers,
                           consistency=args.consistency, staleness=args.staleness if args.consistency == "ssp" else 0,
                           seed=args.seed)
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
        job.push()                                            # one push of every table's row gradients
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
