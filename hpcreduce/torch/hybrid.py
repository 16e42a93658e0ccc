"""Hybrid training: a model's ``EmbeddingBagCollection`` tables on parameter-server shards, the
dense rest averaged among the trainers by ``DistributedDataParallel`` (as PERSIA and TorchRec train).

    model = MyRecModel()                      # holds an EmbeddingBagCollection and dense layers
    job = hpcreduce.torch.start_hybrid(model, sparse_optimizer=RowOptimizer("sgd", lr=0.01),
                                       layout="dedicated", servers=2, consistency="bsp")
    if isinstance(job, hpcreduce.ps.Server):
        job.serve()                           # until every trainer released it
    else:
        dense_optimizer = torch.optim.SGD(job.module.parameters(), lr=0.01)
        for batch in my_shard:
            dense_optimizer.zero_grad()
            loss_fn(job.module(batch)).backward()   # dense gradients averaged over the trainers
            job.push()                        # one push of every table's row gradients (async)
            dense_optimizer.step()
            job.clock()                       # waits for the push, ends the step
        job.release()

Layouts (``layouts``): ``dedicated``, ranks 0..K-1 serve the tables and the others train;
``colocated``, every rank trains and holds a shard (``hpcreduce.ps.colocated.ColocatedTables``;
its pulls and pushes are collective: every trainer steps alike). The tables' optimizer and
learning rate are ``sparse_optimizer``'s, nothing hidden; ``consistency``/``staleness``: when
the dedicated servers answer pulls (``ps.Consistency``; BSP by default). A pushed row gradient
is scaled by 1/trainers, so the sparse and the dense parts both follow the gradient of the mean
loss over the global batch. Fault tolerance: a colocated job's loop under ``hpcreduce.elastic``
(``elastic.State(hybrid=job, ...)``, ``hybrid_elastic``) survives a SIGKILLed rank in place; for
the dedicated layout ``model_adapter.TorchModel`` runs the same module under
``hpcreduce.train``'s hybrid trainer, which survives a SIGKILLed worker or server.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Union

import torch

from ..collectives.validate import InputProblem, ProblemKind, agree, raise_local, stable_hash
from ..ps import Consistency, Server
from ..runtime.context import resolve
from .ddp import DistributedDataParallel
from .embedding_collection import EmbeddingBagCollection
from .embedding_configs import RowOptimizer, init_fn_problem
from .hybrid_elastic import ElasticJob, tables_anew
from .layouts import LAYOUTS, SHARDINGS, start_tables
from .table_files import SavedTables, saved_problem


class HybridWorker(ElasticJob):
    """A trainer of a hybrid job: ``module`` (the model wrapped in ``DistributedDataParallel``
    over the trainers (``context``: colocated, the job's context, so that an elastic recovery
    reaches it); the model itself when it has no dense parameter), ``comm`` (the trainers'
    communicator), ``collection`` (its bound ``EmbeddingBagCollection``) and ``store`` (the
    ``ps.Worker``, ``ColocatedTables`` or ``TableWiseTables`` it pulls and pushes through);
    ``early_pull``: whether a pull may leave before this step's push is applied (dedicated SSP
    with staleness >= 1, or ASP); ``layout``, ``sharding``: ``start_hybrid``'s; ``recoveries``:
    the shard keys lost at each recovery under ``hpcreduce.elastic`` (``hybrid_elastic``);
    ``tables_anew`` (colocated): makes the tables anew with no row over a growth's ranks
    (``hybrid_elastic.tables_anew``). On a rank spawned into an elastic job ``store`` is None
    and ``collection`` unbound until the growth's sync."""

    def __init__(self, module: torch.nn.Module, collection: EmbeddingBagCollection, store, comm, early_pull: bool,
                 layout: str = "dedicated", sharding: str = "row_wise", context=None,
                 tables_anew: Optional[Callable[..., Any]] = None):
        self.module, self.collection, self.store, self.comm = module, collection, store, comm
        self.early_pull, self.layout, self.sharding, self.context = early_pull, layout, sharding, context
        self.tables_anew = tables_anew
        self.recoveries: List[List[int]] = []
        self._pushes: List[object] = []
        if layout == "colocated" and store is not None:
            store.on_failure = self.revoke_others

    def push(self) -> None:
        """Start the push of this step's row gradients (one for all tables). Call after
        ``backward()``; ``clock()`` waits for it."""
        self._pushes.append(self.collection.push())

    def wait_pushes(self) -> None:
        """Wait for every push started."""
        pushes, self._pushes = self._pushes, []
        for handle in pushes:
            handle.wait()

    def clock(self) -> int:
        """End the step: push (unless ``push()`` already did this step), wait for the pushes,
        tell the servers. Every trainer pushes once a step, with rows or without (the colocated
        layout's push is collective)."""
        if not self._pushes:
            self.push()
        self.wait_pushes()
        return self.store.clock()

    def release(self) -> None:
        """Done: the servers stop once every trainer released them."""
        self.store.release()


def start_hybrid(module: torch.nn.Module, *, sparse_optimizer: RowOptimizer, layout: str = "dedicated",
                 servers: int = 1, consistency: str = "bsp", staleness: int = 0, seed: int = 0,
                 tables_from: Optional[str] = None, sharding: Optional[str] = None, comm=None,
                 **ddp_options) -> Union[Server, HybridWorker]:
    """Start a hybrid job for ``module`` (collective over ``comm``'s ranks; build the module the
    same way everywhere): with ``layout="dedicated"`` a ``Server`` on ranks 0..servers-1 (call
    ``serve()``) and a ``HybridWorker`` elsewhere; with ``"colocated"`` a ``HybridWorker`` on
    every rank. ``sharding`` (colocated): ``"row_wise"``, rows hashed over every rank, the
    trainers pool; ``"table_wise"``, each fixed table whole on one rank, which pools its bags
    (TorchRec's exchange); default: table-wise when every table is fixed, else row-wise. The
    tables are the module's ``EmbeddingBagCollection``'s (exactly one), fixed
    ones initialised from ``seed`` or read from ``tables_from`` (a ``save_tables`` directory, of
    any number of trainers: resharded by id); ``ddp_options``: ``DistributedDataParallel``'s for the dense
    part (a module with no dense parameter is not wrapped). Bad input (no collection or two,
    tables declared differently on two ranks, an ``init_fn`` that changes the shape or dtype, an
    unknown layout or optimizer, saved tables of another layout) raises on every rank before anything is made; a dense part the
    wrapper refuses raises on every trainer, which release the servers first. On a rank spawned into
    a colocated job under ``hpcreduce.elastic`` (``context.joined``) nothing communicates: the tables
    are made and filled, with the job's ranks, at the growth's sync (``hybrid_elastic``)."""
    context = resolve(comm)
    collections = [m for m in module.modules() if isinstance(m, EmbeddingBagCollection)]
    configs = collections[0].embedding_bag_configs() if len(collections) == 1 else []
    signature = [config.signature() for config in configs]
    problems = [] if len(collections) == 1 else [f"the module holds {len(collections)} EmbeddingBagCollections "
                                                 f"(start_hybrid takes exactly one; put every table in it)"]
    problems += [p for p in (init_fn_problem(config) for config in configs) if p]
    saved = saved_problem(tables_from, configs)
    if saved:
        problems.append(saved)
    if layout not in LAYOUTS:
        problems.append(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if sharding is None:  # the faster one where it can be: every table fixed, colocated
        fixed = all(config.num_embeddings is not None for config in configs)
        sharding = "table_wise" if layout == "colocated" and fixed else "row_wise"
    if sharding not in SHARDINGS or (sharding == "table_wise" and layout != "colocated"):
        problems.append(f"sharding must be one of {', '.join(SHARDINGS)} (table_wise with layout=\"colocated\"), "
                        f"got {sharding!r} with layout {layout!r}")
    if layout == "colocated" and (consistency != "bsp" or staleness != 0):
        problems.append(f"layout=\"colocated\" is synchronous (every rank pulls and pushes its shard's rows "
                        f"together each step): consistency must be \"bsp\" with staleness 0, got {consistency!r} "
                        f"with staleness {staleness} (SSP and ASP need the dedicated layout's servers)")
    if not isinstance(sparse_optimizer, RowOptimizer):
        problems.append(f"sparse_optimizer must be a RowOptimizer(name, lr), got {sparse_optimizer!r}")
    elif sparse_optimizer.problem():
        problems.append(sparse_optimizer.problem())
    problem = InputProblem(ProblemKind.UNUSABLE_ARRAY, "; ".join(problems)) if problems else None
    joining = context.joined and layout == "colocated"  # spawned into an elastic job: its peers are in a sync
    if joining:
        raise_local("start_hybrid", problem, context.rank)
    else:
        agree(context, "start_hybrid", [("tables", stable_hash(signature), lambda: signature),
                                        ("layout", stable_hash((layout, sharding, servers, consistency, staleness,
                                                                seed)),
                                         (layout, sharding, servers, consistency, staleness, seed))], problem)
    consistency_model = Consistency(consistency, staleness)
    role, trainers_comm, trainers = (None, None, 0) if joining else start_tables(
        configs, layout, servers, consistency_model, sparse_optimizer, seed, context,
        SavedTables(tables_from) if tables_from else None, sharding)
    if isinstance(role, Server):
        return role
    group = context if layout == "colocated" else trainers_comm  # colocated: the context a recovery shrinks
    collection = collections[0] if joining else collections[0].bind(role, trainers, resolve(group))
    try:
        wrapped = DistributedDataParallel(module, comm=group, **ddp_options) \
            if any(param.requires_grad for param in module.parameters()) else module
    except Exception:
        if role is not None:
            role.release()  # every trainer raised (the wrapper's checks agree): the servers' serve() returns
        raise
    early = layout == "dedicated" and (consistency_model.kind == "asp" or consistency_model.staleness >= 1)
    anew = tables_anew(configs, sparse_optimizer, seed, sharding) if layout == "colocated" else None
    return HybridWorker(wrapped, collection, role, trainers_comm, early, layout, sharding, resolve(group), anew)
