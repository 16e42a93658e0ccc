"""Part ``peers`` of ``hpcreduce bench embeddings``: one DLRM, the same data and ranks, three ways.

- ``torch_ddp``: every rank trains a replica of the whole model, its tables
  ``nn.EmbeddingBag(sparse=True)``, under torch's ``DistributedDataParallel`` over gloo.
- ``torchrec``: TorchRec's ``DistributedModelParallel`` on CPU, each table whole on one rank
  (table-wise sharding, the one that runs on CPU), the dense part data-parallel; where
  ``torchrec`` and ``fbgemm-gpu-cpu`` import (``torchrec_peer``).
- ``hpcreduce``: hybrid, as PERSIA runs it: ranks 0..K-1 (``--servers``) hold the tables
  (``hpcreduce.torch.PSEmbeddingBag``), the other ranks train and average the dense gradients
  with hpcreduce's DDP; where ``hpcreduce.torch.embedding_bag`` exists.

A candidate that cannot run here is left out on every rank, with the reason in the JSON. The
rest are timed interleaved (``timing.interleaved_medians``, each round starting one candidate
later), ``STEPS_PER_CALL`` steps a call, one torch thread per rank, SGD everywhere. Reported
per candidate: examples/s (training ranks x ``--batch`` / step time), the bytes the busiest
training rank sends per step as modelled from this batch's ids and each one's message pattern
(``bytes_*``), the RSS each rank gained building it and taking its first step, and the
process's peak RSS (all candidates together: run one ``--peers`` at a time for each's own peak).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from mpi4py import MPI

from ..ps import Server
from ..runtime.context import Context
from ..runtime.memory import available_bytes, peak_rss_bytes, rss_bytes
from ..runtime.nodes import rank_nodes
from .dlrm import DLRM, EmbeddingBags, PSBags, Shape, batch_of, dense_parameters
from .timing import interleaved_medians
from .torch_peers import start_gloo

STEPS_PER_CALL = 4  # a hybrid call also opens and releases the servers' session: amortised
LR = 0.01


@dataclass
class Candidate:
    """``steps(n)``: n training steps on this rank (a server serves them); ``trainers``: ranks
    that train; ``bytes_per_step``: what each of them sends per step (modelled)."""

    steps: Callable[[int], None]
    trainers: int
    bytes_per_step: float


def measure(context: Context, args) -> Dict[str, object]:
    torch.set_num_threads(1)
    comm = context.comm
    start_gloo(comm)
    shape = Shape(args.fields, args.field_rows, args.dim, args.bag, args.batch)
    batch = batch_of(shape, comm.Get_rank())
    built: Dict[str, Candidate] = {}
    left_out: Dict[str, str] = {}
    added_rss: Dict[str, List[int]] = {}
    for name in args.peers.split(","):
        reasons = [why for why in comm.allgather(unavailable(name, comm, args.servers, shape)) if why]
        if reasons:
            left_out[name] = reasons[0]
            continue
        before = rss_bytes()
        torch.manual_seed(0)
        built[name] = BUILDERS[name](comm, shape, batch, args)
        built[name].steps(1)
        added_rss[name] = comm.allgather(rss_bytes() - before)
    medians = interleaved_medians(comm, {name: lambda c=c: c.steps(STEPS_PER_CALL) for name, c in built.items()},
                                  warmup=args.warmup, iterations=args.iterations, rotate=True) if built else {}
    sent = {name: comm.allreduce(c.bytes_per_step, op=MPI.MAX) for name, c in built.items()}  # the busiest trainer
    rows = {name: {"step_s": medians[name] / STEPS_PER_CALL, "trainers": c.trainers,
                   "examples_per_s": c.trainers * shape.batch * STEPS_PER_CALL / medians[name],
                   "bytes_per_step": sent[name], "added_rss_bytes": added_rss[name]}
            for name, c in built.items()}
    return {"shape": shape.__dict__, "servers": args.servers, "steps_per_call": STEPS_PER_CALL, "candidates": rows,
            "left_out": left_out, "peak_rss_bytes": comm.allgather(peak_rss_bytes())}


def unavailable(name: str, comm: MPI.Intracomm, servers: int, shape: Shape) -> Optional[str]:
    """Why candidate ``name`` cannot run on this rank (None: it can): torch DDP's replicas of the
    tables (values and as much again for their sparse gradients and optimizer's touch) would not
    fit this node's memory, TorchRec does not import, hpcreduce lacks hybrid mode."""
    if name == "torch_ddp":
        nodes = rank_nodes(comm)  # collective: every rank asks about the same candidates in order
        here = nodes.count(nodes[comm.Get_rank()])
        need, available = here * shape.fields * shape.rows * shape.dim * 4, available_bytes()
        if available is not None and need > available:
            return (f"its replicated tables do not fit: {here} ranks x {shape.fields} x {shape.rows} rows x "
                    f"{shape.dim} float32 = {need / 2**30:.1f} GiB on a node with {available / 2**30:.1f} GiB available")
    if name == "torchrec":
        from .torchrec_peer import import_problem
        return import_problem()
    if name == "hpcreduce":
        if importlib.util.find_spec("hpcreduce.torch.embedding_bag") is None:
            return "hpcreduce.torch.embedding_bag (PSEmbeddingBag, hybrid mode) is not in this version"
        if not 1 <= servers < comm.Get_size():
            return f"hybrid needs 1 <= --servers < ranks, got --servers {servers} on {comm.Get_size()} ranks"
    return None


def unique_rows(ids: torch.Tensor) -> int:
    """Distinct rows this batch touches, summed over the fields' tables."""
    return sum(int(torch.unique(ids[:, field]).numel()) for field in range(ids.shape[1]))


def ring_allreduce_bytes(nbytes: int, ranks: int) -> float:
    """Bytes each rank sends in a ring allreduce of ``nbytes``."""
    return 2 * (ranks - 1) / ranks * nbytes


def sgd_step(model: torch.nn.Module, batch, parameters=None) -> Callable[[int], None]:
    """``n`` steps of SGD on ``batch`` (dense, ids, labels) through ``model``."""
    dense, ids, labels = batch
    optimizer = torch.optim.SGD(parameters if parameters is not None else model.parameters(), lr=LR)

    def steps(count: int) -> None:
        for _ in range(count):
            optimizer.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), labels).backward()
            optimizer.step()
    return steps


def torch_ddp(comm: MPI.Intracomm, shape: Shape, batch, args) -> Candidate:
    """torch DDP over gloo, the tables replicated; sparse gradients go by gloo's allgather of each
    rank's coalesced (ids, rows): (ranks - 1) x its unique rows x (8 + 4 dim) bytes sent."""
    model = DLRM(EmbeddingBags(shape), shape)
    ranks = comm.Get_size()
    sparse = (ranks - 1) * unique_rows(batch[1]) * (8 + 4 * shape.dim)
    return Candidate(sgd_step(torch.nn.parallel.DistributedDataParallel(model), batch, model.parameters()), ranks,
                     ring_allreduce_bytes(4 * dense_parameters(model), ranks) + sparse)


def torchrec(comm: MPI.Intracomm, shape: Shape, batch, args) -> Candidate:
    """TorchRec, table-wise on CPU (``torchrec_peer``)."""
    from .torchrec_peer import build
    steps, dense_elements = build(shape, batch, LR)
    ranks = comm.Get_size()
    remote = shape.fields * (ranks - 1) / ranks  # fields whose table is on another rank, on average
    ids = remote * shape.batch * (8 * shape.bag + 4)  # ids and lengths to the tables' ranks
    pooled = 2 * remote * shape.batch * 4 * shape.dim  # pooled rows back, their gradients out
    return Candidate(steps, ranks, ring_allreduce_bytes(4 * dense_elements, ranks) + ids + pooled)


def hpcreduce_hybrid(comm: MPI.Intracomm, shape: Shape, batch, args) -> Candidate:
    """hpcreduce hybrid: the tables on ``--servers`` ranks (SSP, staleness 2, SGD), each worker
    pulling and pushing its batch's unique rows (ids once: the push reuses the pull's cached id
    list), the dense gradients ring-allreduced among the workers."""
    from ..torch import start_hybrid
    model = DLRM(PSBags(shape), shape)
    job = start_hybrid(model, servers=args.servers, consistency="ssp", staleness=2, optimizer="sgd", lr=LR,
                       comm=comm)
    workers = comm.Get_size() - args.servers
    if isinstance(job, Server):
        return Candidate(lambda _count: job.serve(), workers, 0.0)
    train = sgd_step(job.module, batch, model.parameters())

    def steps(count: int) -> None:
        job.worker.reopen()
        for _ in range(count):
            train(1)
            job.clock()
        job.release()
    rows = unique_rows(batch[1])
    return Candidate(steps, workers, ring_allreduce_bytes(4 * dense_parameters(model), workers)
                     + rows * (8 + 4 * shape.dim))


BUILDERS = {"torch_ddp": torch_ddp, "torchrec": torchrec, "hpcreduce": hpcreduce_hybrid}


def render(result: Dict[str, object]) -> List[str]:
    shape = result["shape"]
    lines = [f"peers: DLRM, {shape['fields']} fields x {shape['rows']} rows x {shape['dim']}, bags of {shape['bag']}, "
             f"batch {shape['batch']} per training rank",
             f"  {'candidate':<10} {'trainers':>8} {'examples/s':>11} {'step ms':>8} {'KiB sent/step':>14} "
             f"{'added RSS MiB (max rank)':>25}"]
    for name, row in result["candidates"].items():
        lines.append(f"  {name:<10} {row['trainers']:>8} {row['examples_per_s']:>11.0f} {row['step_s'] * 1e3:>8.2f} "
                     f"{row['bytes_per_step'] / 1024:>14.1f} {max(row['added_rss_bytes']) / 2 ** 20:>25.1f}")
    for name, why in result["left_out"].items():
        lines.append(f"  {name:<10} left out: {why}")
    lines.append(f"  peak RSS per rank (MiB): {', '.join(f'{p / 2 ** 20:.0f}' for p in result['peak_rss_bytes'])}")
    return lines
