"""Hybrid training as PERSIA runs it: embedding tables on K servers, the dense rest allreduced.

    model = MyRecModel()                      # holds PSEmbeddingBag(s) and dense layers
    job = hpcreduce.torch.start_hybrid(model, servers=2, consistency="ssp", staleness=2,
                                       optimizer="adagrad", lr=0.05)
    if isinstance(job, hpcreduce.ps.Server):
        job.serve()                           # until every worker released it
    else:
        dense_optimizer = torch.optim.Adam(job.module.parameters())
        for batch, labels in my_shard:
            dense_optimizer.zero_grad()
            loss_fn(job.module(batch), labels).backward()   # dense gradients averaged over workers
            job.push()                        # the bags' row gradients to the servers (async)
            dense_optimizer.step()
            job.clock()                       # waits for the pushes, ends the step
        job.release()

The job's ranks 0..K-1 serve the bags' tables (``PSEmbeddingBag.spec``; the servers run
``optimizer`` on the rows: SGD, Adagrad, ...); the other ranks are workers, split into their
own communicator, over which ``DistributedDataParallel`` averages the dense gradients
(synchronous, every step). A pushed row gradient is scaled by 1/workers, so the sparse and
the dense parts both follow the gradient of the mean loss over the global batch.
Fault tolerance (a worker or server SIGKILLed) is not handled here: a lost rank stops the job;
``model_adapter.TorchModel`` runs the same module under ``hpcreduce.train``'s hybrid trainer, which recovers.
"""
from __future__ import annotations

from typing import Dict, List, Union

import torch
from mpi4py import MPI

from ..collectives.validate import InputProblem, ProblemKind, agree, stable_hash
from ..ps import Consistency, Server, start
from ..ps.handles import Handle
from ..ps.init import PartInit, counter_normal
from ..runtime.context import resolve
from .ddp import DistributedDataParallel
from .embedding_bag import PSEmbeddingBag


class HybridWorker:
    """A worker of a hybrid job: ``module`` (the model wrapped in ``DistributedDataParallel``
    over the workers' communicator ``comm``; the model itself when it has no dense parameter),
    ``bags`` (its bound ``PSEmbeddingBag``s by table) and ``worker`` (the ``hpcreduce.ps.Worker``
    they pull and push through)."""

    def __init__(self, module: DistributedDataParallel, bags: Dict[str, PSEmbeddingBag], worker, comm: MPI.Intracomm):
        self.module, self.bags, self.worker, self.comm = module, bags, worker, comm
        self._pushes: List[Handle] = []

    def push(self) -> None:
        """Start every bag's push of this step's row gradients (one per table; a bag with no
        new gradient sends nothing). Call after ``backward()``; ``clock()`` waits for them."""
        for bag in self.bags.values():
            handle = bag.push()
            if handle is not None:
                self._pushes.append(handle)

    def clock(self) -> int:
        """End the step: push what ``push()`` has not yet, wait for every push, tell the servers."""
        self.push()
        pushes, self._pushes = self._pushes, []
        for handle in pushes:
            handle.wait()
        return self.worker.clock()

    def release(self) -> None:
        """Done: the servers stop once every worker released them."""
        self.worker.release()


def start_hybrid(module: torch.nn.Module, *, servers: int = 1, consistency: str = "ssp", staleness: int = 0,
                 optimizer: str = "adagrad", lr: float = 0.05, seed: int = 0, comm=None,
                 **ddp_options) -> Union[Server, HybridWorker]:
    """Start a hybrid job for ``module`` (collective over ``comm``'s ranks; build the module the
    same way everywhere): a ``Server`` on ranks 0..servers-1 (call ``serve()``) holding the
    tables of ``module``'s ``PSEmbeddingBag``s (fixed tables initialised from ``seed``), a
    ``HybridWorker`` elsewhere. ``consistency``/``staleness``: when the servers answer pulls
    (``ps.Consistency``); ``optimizer``/``lr``: the servers' update of the rows; ``ddp_options``:
    ``DistributedDataParallel``'s (bucket_cap_mb, compression, ...) for the dense part (a module
    with no dense parameter is not wrapped). A dynamic table starts from its ``Dynamic``'s seed.
    Bad input (no bag, two bags naming one table, ranks whose bags differ) raises on every rank;
    a dense part the wrapper refuses raises on every worker, which release the servers first."""
    context = resolve(comm)
    bags = [bag for bag in module.modules() if isinstance(bag, PSEmbeddingBag)]
    specs = [bag.spec for bag in bags]
    names = [spec.name for spec in specs]
    doubled = sorted({name for name in names if names.count(name) > 1})
    problem = ("the module has no PSEmbeddingBag (use DistributedDataParallel alone)" if not bags else
               f"tables {doubled} are named by more than one PSEmbeddingBag (use one bag for a shared table)"
               if doubled else None)
    agree(context, "start_hybrid", [("tables", stable_hash(specs), lambda: specs)],
          InputProblem(ProblemKind.UNUSABLE_ARRAY, problem) if problem else None)
    scales = {t: bag.init_scale for t, bag in enumerate(bags)}

    def elements(table: int, flat):
        return counter_normal(seed, names[table], flat, scales[table])
    role = start(specs, PartInit(specs, elements), servers=servers, consistency=Consistency(consistency, staleness),
                 optimizer=optimizer, lr=lr, comm=context)
    serving = isinstance(role, Server)
    workers = context.comm.Split(MPI.UNDEFINED if serving else 0, context.rank)
    if serving:
        return role
    for bag in bags:
        bag.bind(role)
    try:
        wrapped = DistributedDataParallel(module, comm=workers, **ddp_options) \
            if any(param.requires_grad for param in module.parameters()) else module
    except Exception:
        role.release()  # every worker raised (the wrapper's checks agree): the servers' serve() returns
        raise
    return HybridWorker(wrapped, dict(zip(names, bags)), role, workers)
