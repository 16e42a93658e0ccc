"""Part ``peers`` of ``hpcreduce bench embeddings``: one DLRM, the same data and ranks, three ways.

- ``torch_ddp``: every rank trains a replica of the whole model, its tables
  ``nn.EmbeddingBag(sparse=True)``, under torch's ``DistributedDataParallel`` over gloo.
- ``torchrec``: TorchRec's ``DistributedModelParallel`` on CPU, each table whole on one rank
  (table-wise sharding, the one that runs on CPU), the dense part data-parallel; where
  ``torchrec`` and ``fbgemm-gpu-cpu`` import (``torchrec_peer``).
- ``hpcreduce``: ``hpcreduce.torch.EmbeddingBagCollection`` (the same model as TorchRec's, by
  changing the import) trained by ``TrainPipeline``, layout ``dedicated``: ranks 0..K-1
  (``--servers``) hold the tables, the other ranks train and average the dense gradients with
  hpcreduce's DDP (BSP: the result an unpipelined run gives).
- ``hpcreduce_colocated``: the same, layout ``colocated``, ``sharding="row_wise"``: a shard of
  every table on every rank, every rank trains (where ``hpcreduce.ps.colocated`` exists).
- ``hpcreduce_tablewise``: colocated, ``sharding="table_wise"``: each table whole on one rank,
  which pools its bags (TorchRec's exchange).

A candidate that cannot run here is left out on every rank, with the reason in the JSON. The
rest are timed interleaved (``timing.interleaved_medians``, each round in another order),
``STEPS_PER_CALL`` steps a call, one torch thread per rank, SGD everywhere. Reported
per candidate: examples/s (training ranks x ``--batch`` / step time) and its ratio to TorchRec's
(``vs_torchrec``, where TorchRec ran), the loss of its last step
(every candidate takes the same number of steps on the same batches), the bytes the busiest
training rank sends per step as modelled from this batch's ids and each one's message pattern
(``bytes_*``), the RSS each rank gained building it and taking its first step, and the
process's peak RSS (all candidates together: run one ``--peers`` at a time for each's own peak), and
``ready_s``: the slowest rank's seconds from building the model to ready to train, and
``first_step_s``: its first step's (tables made on first touch draw that batch's rows then).
"""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mpi4py import MPI

from ..ps import Server
from ..runtime.context import Context
from ..runtime.memory import available_bytes, peak_rss_bytes, rss_bytes
from ..runtime.nodes import rank_nodes
from .dlrm import DLRM, CollectionBags, EmbeddingBags, Pipelined, Shape, SparseBatch, batch_of, dense_parameters, jagged
from .timing import interleaved_medians
from .torch_peers import start_gloo

STEPS_PER_CALL = 4  # a hybrid call also opens and releases the servers' session: amortised
LR = 0.01


@dataclass
class Candidate:
    """``steps(n)``: n training steps on this rank (a server serves them); ``trainers``: ranks
    that train; ``bytes_per_step``: what each of them sends per step (modelled); ``loss()``:
    the last step's mean loss on this rank (None on a server)."""

    steps: Callable[[int], None]
    trainers: int
    bytes_per_step: float
    loss: Callable[[], Optional[float]]


def measure(context: Context, args) -> Dict[str, object]:
    torch.set_num_threads(1)
    comm = context.comm
    start_gloo(comm)
    shape = Shape(args.fields, args.field_rows, args.dim, args.bag, args.batch)
    batch = batch_of(shape, comm.Get_rank())
    built: Dict[str, Candidate] = {}
    left_out: Dict[str, str] = {}
    added_rss: Dict[str, List[int]] = {}
    ready_s: Dict[str, float] = {}
    first_s: Dict[str, float] = {}
    for name in args.peers.split(","):
        reasons = [why for why in comm.allgather(unavailable(name, comm, args.servers, shape, args.dynamic_tables))
                   if why]
        if reasons:
            left_out[name] = reasons[0]
            continue
        before = rss_bytes()
        torch.manual_seed(0)
        comm.Barrier()
        started = time.perf_counter()
        built[name] = BUILDERS[name](comm, shape, batch, args)
        ready_s[name] = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
        started = time.perf_counter()
        built[name].steps(1)
        first_s[name] = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
        added_rss[name] = comm.allgather(rss_bytes() - before)
    medians = interleaved_medians(comm, {name: lambda c=c: c.steps(STEPS_PER_CALL) for name, c in built.items()},
                                  warmup=args.warmup, iterations=args.iterations, shuffle=True) if built else {}
    sent = {name: comm.allreduce(c.bytes_per_step, op=MPI.MAX) for name, c in built.items()}  # the busiest trainer
    losses = {name: [x for x in comm.allgather(c.loss()) if x is not None] for name, c in built.items()}
    rows = {name: {"step_s": medians[name] / STEPS_PER_CALL, "trainers": c.trainers,
                   "examples_per_s": c.trainers * shape.batch * STEPS_PER_CALL / medians[name],
                   "loss": sum(losses[name]) / len(losses[name]), "bytes_per_step": sent[name],
                   "added_rss_bytes": added_rss[name], "ready_s": ready_s[name],
                   "first_step_s": first_s[name]}
            for name, c in built.items()}
    for row in rows.values():  # the ratio the target is stated in, when TorchRec ran
        row["vs_torchrec"] = row["examples_per_s"] / rows["torchrec"]["examples_per_s"] if "torchrec" in rows else None
    return {"shape": shape.__dict__, "servers": args.servers, "steps_per_call": STEPS_PER_CALL, "candidates": rows,
            "left_out": left_out, "peak_rss_bytes": comm.allgather(peak_rss_bytes())}


def unavailable(name: str, comm: MPI.Intracomm, servers: int, shape: Shape, dynamic: bool) -> Optional[str]:
    """Why candidate ``name`` cannot run on this rank (None: it can): torch DDP's replicas of the
    tables (values and as much again for their sparse gradients and optimizer's touch) would not
    fit this node's memory, TorchRec does not import, hpcreduce lacks hybrid mode, table-wise
    sharding is asked for dynamic tables (``dynamic``: it holds fixed ones)."""
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
    if name == "hpcreduce" and not 1 <= servers < comm.Get_size():
        return f"the dedicated layout needs 1 <= --servers < ranks, got --servers {servers} on {comm.Get_size()} ranks"
    if name == "hpcreduce_colocated" and importlib.util.find_spec("hpcreduce.ps.colocated") is None:
        return "hpcreduce.ps.colocated (ColocatedTables, the colocated layout) is not in this version"
    if name == "hpcreduce_tablewise" and dynamic:
        return "table-wise sharding holds fixed tables only (--dynamic-tables: hpcreduce_colocated, row-wise)"
    return None


def unique_rows(ids: torch.Tensor) -> int:
    """Distinct rows this batch touches, summed over the fields' tables."""
    return sum(int(torch.unique(ids[:, field]).numel()) for field in range(ids.shape[1]))


def ring_allreduce_bytes(nbytes: int, ranks: int) -> float:
    """Bytes each rank sends in a ring allreduce of ``nbytes``."""
    return 2 * (ranks - 1) / ranks * nbytes


def sgd_step(model: torch.nn.Module, batch, parameters=None) -> Tuple[Callable[[int], None], Callable[[], float]]:
    """``n`` steps of SGD on ``batch`` (dense, ids, labels) through ``model``; the last step's loss."""
    dense, ids, labels = batch
    optimizer = torch.optim.SGD(parameters if parameters is not None else model.parameters(), lr=LR)
    losses = [float("nan")]

    def steps(count: int) -> None:
        for _ in range(count):
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), labels)
            loss.backward()
            optimizer.step()
            losses[0] = float(loss.detach())
    return steps, lambda: losses[0]


def torch_ddp(comm: MPI.Intracomm, shape: Shape, batch, args) -> Candidate:
    """torch DDP over gloo, the tables replicated; sparse gradients go by gloo's allgather of each
    rank's coalesced (ids, rows): (ranks - 1) x its unique rows x (8 + 4 dim) bytes sent."""
    model = DLRM(EmbeddingBags(shape), shape)
    ranks = comm.Get_size()
    sparse = (ranks - 1) * unique_rows(batch[1]) * (8 + 4 * shape.dim)
    steps, loss = sgd_step(torch.nn.parallel.DistributedDataParallel(model), batch, model.parameters())
    return Candidate(steps, ranks, ring_allreduce_bytes(4 * dense_parameters(model), ranks) + sparse, loss)


def torchrec(comm: MPI.Intracomm, shape: Shape, batch, args) -> Candidate:
    """TorchRec, table-wise on CPU (``torchrec_peer``)."""
    from .torchrec_peer import build
    steps, dense_elements, loss = build(shape, batch, LR)
    ranks = comm.Get_size()
    remote = shape.fields * (ranks - 1) / ranks  # fields whose table is on another rank, on average
    ids = remote * shape.batch * (8 * shape.bag + 4)  # ids and lengths to the tables' ranks
    pooled = 2 * remote * shape.batch * 4 * shape.dim  # pooled rows back, their gradients out
    return Candidate(steps, ranks, ring_allreduce_bytes(4 * dense_elements, ranks) + ids + pooled, loss)


def hpcreduce_pipeline(comm: MPI.Intracomm, shape: Shape, batch, args, layout: str,
                       sharding: str = "row_wise") -> Candidate:
    """hpcreduce: ``EmbeddingBagCollection`` + ``TrainPipeline`` (BSP, server SGD), ``layout``
    ``dedicated`` (``--servers`` ranks serve) or ``colocated`` (every rank trains and holds a
    shard); each trainer pulls and pushes its batch's unique rows once per step for all tables,
    the dense gradients ring-allreduced among the trainers."""
    from .. import torch as hpt
    model = DLRM(CollectionBags(shape, hpt, dynamic=args.dynamic_tables), shape)
    job = hpt.start_hybrid(Pipelined(model), sparse_optimizer=hpt.RowOptimizer("sgd", lr=LR), layout=layout,
                           servers=args.servers, consistency="bsp", sharding=sharding, comm=comm,
                           broadcast_buffers=False)  # as TorchRec's DistributedModelParallel wraps the dense part
    trainers = comm.Get_size() - (args.servers if layout == "dedicated" else 0)
    if isinstance(job, Server):
        return Candidate(lambda _count: job.serve(), trainers, 0.0, lambda: None)
    dense, ids, labels = batch
    step_batch = SparseBatch(dense, jagged(ids, hpt), labels)
    optimizer = torch.optim.SGD(job.module.parameters(), lr=LR)
    losses = [float("nan")]

    def steps(count: int) -> None:
        if layout == "dedicated":
            job.store.reopen()
        pipeline = hpt.TrainPipeline(job, optimizer)
        batches = iter([step_batch] * count)
        for _ in range(count):
            losses[0] = float(pipeline.progress(batches))
        if layout == "dedicated":
            job.release()
    dense = ring_allreduce_bytes(4 * dense_parameters(model), trainers)
    if sharding == "table_wise":  # as TorchRec's: ids and lengths out, pooled rows back, their gradients out
        remote = shape.fields * (trainers - 1) / trainers
        return Candidate(steps, trainers, dense + remote * shape.batch * (8 * shape.bag + 8 + 8 * shape.dim),
                         lambda: losses[0])
    return Candidate(steps, trainers, dense + unique_rows(ids) * (8 + 4 * shape.dim), lambda: losses[0])


BUILDERS = {"torch_ddp": torch_ddp, "torchrec": torchrec,
            "hpcreduce": lambda *a: hpcreduce_pipeline(*a, layout="dedicated"),
            "hpcreduce_colocated": lambda *a: hpcreduce_pipeline(*a, layout="colocated"),
            "hpcreduce_tablewise": lambda *a: hpcreduce_pipeline(*a, layout="colocated", sharding="table_wise")}


def render(result: Dict[str, object]) -> List[str]:
    shape = result["shape"]
    lines = [f"peers: DLRM, {shape['fields']} fields x {shape['rows']} rows x {shape['dim']}, bags of {shape['bag']}, "
             f"batch {shape['batch']} per training rank",
             f"  {'candidate':<20} {'trainers':>8} {'examples/s':>11} {'x torchrec':>10} {'step ms':>8} {'loss':>7} "
             f"{'KiB sent/step':>14} {'added RSS MiB (max rank)':>25} {'ready s':>8} {'1st step s':>10}"]
    for name, row in result["candidates"].items():
        ratio = "-" if row.get("vs_torchrec") is None else f"{row['vs_torchrec']:.2f}"
        lines.append(f"  {name:<20} {row['trainers']:>8} {row['examples_per_s']:>11.0f} {ratio:>10} "
                     f"{row['step_s'] * 1e3:>8.2f} {row['loss']:>7.4f} {row['bytes_per_step'] / 1024:>14.1f} "
                     f"{max(row['added_rss_bytes']) / 2 ** 20:>25.1f} {row['ready_s']:>8.2f} {row['first_step_s']:>10.2f}")
    for name, why in result["left_out"].items():
        lines.append(f"  {name:<20} left out: {why}")
    lines.append(f"  peak RSS per rank (MiB): {', '.join(f'{p / 2 ** 20:.0f}' for p in result['peak_rss_bytes'])}")
    return lines
