"""``EmbeddingBagCollection``: TorchRec's module of pooled embedding tables, the tables held by
parameter-server shards (dedicated servers, or a shard on every trainer: ``hybrid.start_hybrid``).

    collection = EmbeddingBagCollection(tables=[EmbeddingBagConfig(100_000, 16, name="t0", feature_names=["f0"]),
                                                EmbeddingBagConfig(None, 16, name="t1", feature_names=["f1", "f2"])])
    job = hpcreduce.torch.start_hybrid(model, sparse_optimizer=RowOptimizer("sgd", lr=0.01))  # binds it
    pooled = collection(features)             # KeyedJaggedTensor -> KeyedTensor (batch, 48)
    loss(pooled.values()).backward()          # the pulled rows get their gradients
    job.push(); job.clock()                   # one push for all tables, then the step ends

Per step, one pull and one push for all tables together (``pull_rows_many_async`` /
``push_rows_many_async``), each table's ids deduplicated once (``routing.plan``). ``prefetch``
starts a batch's pull early; the forward on a batch with the same keys, lengths and ids uses
it (matched by content, never by tensor identity). ``push()`` sends every forward's row
gradients since the last push, summed by id, times 1/trainers: the servers' sum over trainers
is then the gradient of the mean loss over the global batch, as ``DistributedDataParallel``'s
average of the dense part. Given rows (``with collection.given_rows({table: (ids, values)})``):
forward reads those (no pull; ``model_adapter.TorchModel`` under the fault-tolerant trainer).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import PSInputError
from ..ps import ParamSpec
from ..ps.updates import joined
from ..ps.kernels import kernel
from .batch_check import BatchCheck
from .embedding_configs import EmbeddingBagConfig
from .jagged import KeyedJaggedTensor, KeyedTensor
from .routing import BatchPlan, lookups, plan, problem

Rows = Dict[str, torch.Tensor]  # table -> the pulled rows' leaf tensor
Grad = Union[torch.Tensor, np.ndarray]  # a table's row gradients (a view of a fused lookup's: numpy)
POOLED_GRAD = kernel("rows", "pooled_grad")


class EmbeddingBagCollection(torch.nn.Module):
    """Pooled embeddings of ``tables`` (``EmbeddingBagConfig``s), rows on parameter-server
    shards. ``is_weighted``: the batch's weights scale each id (per-sample weights, SUM
    pooling). ``device``: where the pooled output goes (the rows travel through host memory).
    Bad declarations (a table named twice, a feature in two tables, a bad config) raise here."""

    def __init__(self, tables: Sequence[EmbeddingBagConfig], is_weighted: bool = False,
                 device: Optional[torch.device] = None):
        super().__init__()
        self._configs = list(tables)
        problems = [p for config in self._configs for p in config.problems()] if all(
            isinstance(c, EmbeddingBagConfig) for c in self._configs) else ["tables must be EmbeddingBagConfigs"]
        names = [config.name for config in self._configs]
        features = [f for config in self._configs if isinstance(config, EmbeddingBagConfig) for f in config.feature_names]
        problems += [f"table {n!r} is declared twice" for n in sorted({n for n in names if names.count(n) > 1})]
        problems += [f"feature {f!r} looks up two tables" for f in sorted({f for f in features if features.count(f) > 1})]
        if not self._configs:
            problems.append("no table")
        if problems:
            raise PSInputError("EmbeddingBagCollection: " + "; ".join(problems))
        self.is_weighted, self.device = is_weighted, device
        self._keys = features
        self._dims = [config.embedding_dim for config in self._configs for _ in config.feature_names]
        self.store, self.scale, self.context = None, 1.0, None
        self._check = BatchCheck(None, self._keys)
        self._pending: List[Tuple[BatchPlan, Rows, Optional[tuple]]] = []  # and (pull handle, rows at) or None
        self._prefetched: Optional[Tuple[BatchPlan, object]] = None
        self._given: Optional[Rows] = None
        self._given_ids: Dict[str, torch.Tensor] = {}

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._configs

    def specs(self, seed: int) -> List[ParamSpec]:
        """The servers' tables (dynamic ones seeded by ``seed``)."""
        return [config.spec(seed) for config in self._configs]

    def bind(self, store, trainers: int, context=None) -> "EmbeddingBagCollection":
        """Pull from and push to ``store`` (a ``ps.Worker`` or ``ps.colocated.ColocatedTables``);
        pushes are scaled by 1/``trainers``; ``context``: the trainers', over which each batch's
        check is agreed (a bad batch raises on every trainer, before any pull)."""
        self._check.free()
        self.store, self.scale, self.context = store, 1.0 / trainers, context
        self._check = BatchCheck(context, self._keys)
        return self

    # -- a step ------------------------------------------------------------------------
    def plan(self, features: KeyedJaggedTensor) -> BatchPlan:
        """The checked, per-table deduplicated batch (bad batch: ``PSInputError``, on every
        trainer when bound)."""
        return self._settled(self.start_plan(features))

    def start_plan(self, features: Optional[KeyedJaggedTensor], ended: bool = False) -> BatchPlan:
        """The batch deduplicated, its check by every trainer started (``batch_check``: a
        nonblocking allreduce); ``start_pull`` (or ``plan``) finishes the check before anything
        moves. A bad batch gives a plan with no tables, refused there on every trainer.
        ``ended``: this trainer's data ended (no batch); once settled, the plan of every
        trainer says ``ended`` (``TrainPipeline`` stops there on every trainer)."""
        if ended:
            routed = BatchPlan(features, 0, {})
            routed.verdict = self._check.start(None, ended=True)
            return routed
        why = problem(self._configs, features, self.is_weighted)
        routed = None
        if why is None:
            try:
                routed = (lookups if self._owners_pool else plan)(self._configs, features, self.is_weighted)
            except ValueError as err:
                why = str(err)
            except Exception as err:  # any local failure planning a batch is agreed, never one rank's traceback
                why = f"planning the batch failed here: {type(err).__name__}: {err}"
        if routed is None:
            routed = BatchPlan(features, 0, {})
        routed.verdict = self._check.start(why)
        return routed

    @staticmethod
    def _settled(routed: BatchPlan) -> BatchPlan:
        """``routed`` once every trainer found its batch good (else the same error everywhere)."""
        if routed.verdict is not None:
            routed.ended = routed.verdict.wait()  # a bad batch raises (again, if retried) on every trainer
            routed.verdict = None
        return routed

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Check, deduplicate and start pulling ``features``' rows now; the next forward on this
        batch uses them (a no-op with given rows)."""
        if self._given is not None:
            return
        routed = self.plan(features)
        if routed.ended:
            raise PSInputError("EmbeddingBagCollection: another trainer's data ended (its TrainPipeline "
                               "stops) while this one looked up a batch outside a TrainPipeline")
        self.start_pull(routed)

    def start_pull(self, routed: BatchPlan) -> None:
        """Start pulling a planned batch's rows (one request for all tables); the next forward
        on that batch uses them (its check is finished first: a bad batch raises on every
        trainer, nothing sent)."""
        if self._settled(routed).ended:
            return
        self._drop_prefetched()
        if routed.lookups is not None:  # table-wise: the owners pool
            self._prefetched = (routed, self._bound().pool_async(routed.lookups))
            return
        self._prefetched = (routed, self._bound().pull_rows_many_async(
            {name: table.unique.numpy() for name, table in routed.tables.items()}))

    @property
    def _owners_pool(self) -> bool:
        """Whether the tables' owners pool the bags (table-wise sharding: ``TableWiseTables``)."""
        return hasattr(self.store, "pool_async")

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Every feature's pooled rows, shaped (batch, sum of the features' dims)."""
        if self._given is not None:
            routed = self.plan(features)
            rows = {name: self._given[name] for name in routed.tables}
            inverse = {name: self._given_positions(name, table.unique)[table.inverse]
                       for name, table in routed.tables.items()}
        else:
            if self._prefetched is not None and self._prefetched[0].features.same_batch(features):
                (routed, handle), self._prefetched = self._prefetched, None
            else:
                self.prefetch(features)
                (routed, handle), self._prefetched = self._prefetched, None
            if routed.lookups is not None:
                return self._owner_pooled(routed, handle)
            if routed.fused is not None:
                return self._fused_forward(routed, handle)
            pulled = handle.wait()
            rows = {name: torch.from_numpy(values) for name, values in pulled.items()}
            inverse = {name: table.inverse for name, table in routed.tables.items()}
            if torch.is_grad_enabled():
                for leaf in rows.values():
                    leaf.requires_grad_(True)
                self._pending.append((routed, rows, None))
        pooled = []
        for config in self._configs:
            table = routed.tables[config.name]
            bags = F.embedding_bag(inverse[config.name], rows[config.name], table.offsets, mode=config.mode,
                                   per_sample_weights=table.weights)
            pooled.append(bags.view(table.features, routed.stride, config.embedding_dim).transpose(0, 1)
                          .reshape(routed.stride, table.features * config.embedding_dim))
        return self._keyed(torch.cat(pooled, dim=1) if len(pooled) > 1 else pooled[0])

    def _fused_forward(self, routed: BatchPlan, handle) -> KeyedTensor:
        """Every table in one lookup over their rows stacked (one leaf; each table's gradient
        is a view of its gradient). Colocated tables' rows are used as they arrived (their
        handle's ``wait_stacked``: no copy; the push sends the leaf's gradient as it is)."""
        fused, config = routed.fused, self._configs[0]
        arrived = getattr(handle, "wait_stacked", lambda names: None)([c.name for c in self._configs])
        if arrived is None:
            pulled = handle.wait()
            stacked = torch.from_numpy(joined([pulled[c.name] for c in self._configs]))  # a view of the pull's rows
            inverse, source = fused.inverse, None
        else:
            stacked, at = (torch.from_numpy(a) for a in arrived)
            inverse, source = at[fused.inverse], (handle, at)
        if torch.is_grad_enabled():
            stacked.requires_grad_(True)
            self._pending.append((routed, {"": stacked}, source))
        bags = PooledRows.apply(stacked, inverse, fused.offsets, fused.bag_of, fused.scale)
        return self._keyed(bags.view(len(self._keys), routed.stride, config.embedding_dim).transpose(0, 1)
                           .reshape(routed.stride, sum(self._dims)))

    def _owner_pooled(self, routed: BatchPlan, handle) -> KeyedTensor:
        """The bags the tables' owners pooled, laid out as the output (batch, the features'
        dims) in one leaf, whose ``.grad`` ``push`` sends back to the owners."""
        pooled, stride, column = handle.wait(), routed.stride, 0
        out = np.empty((stride, sum(self._dims)), pooled[0].dtype if pooled else np.float32)
        for config, rows in zip(self._configs, pooled):
            for j in range(len(config.feature_names)):
                out[:, column:column + config.embedding_dim] = rows[j * stride:(j + 1) * stride]
                column += config.embedding_dim
        leaf = torch.from_numpy(out)
        if torch.is_grad_enabled():
            self._pending.append((routed, {"": leaf.requires_grad_(True)}, "pooled"))
        return self._keyed(leaf)

    def _push_pooled(self, pending):
        """``push`` under table-wise sharding: the last forward's bag gradients to the owners
        (per table, its features' columns of the output's gradient, feature after feature)."""
        problem = "table-wise sharding pushes one forward's gradients per step, got several" \
            if len(pending) > 1 else None
        leaf = pending[-1][1][""] if pending else None
        grad = None if leaf is None or leaf.grad is None else leaf.grad.detach().numpy()
        grads, column = [], 0
        for config in self._configs:
            width = config.embedding_dim * len(config.feature_names)
            if grad is not None:
                part = grad[:, column:column + width].reshape(len(grad), len(config.feature_names),
                                                              config.embedding_dim)
                grads.append(np.ascontiguousarray(part.transpose(1, 0, 2)).reshape(-1, config.embedding_dim))
            column += width
        return self._bound().push_pooled_async(grads if grad is not None else [None] * len(self._configs),
                                               self.scale, problem)

    def _keyed(self, values: torch.Tensor) -> KeyedTensor:
        return KeyedTensor(self._keys, self._dims, values if self.device is None else values.to(self.device))

    def push(self):
        """Start one push of every forward's row gradients since the last push (every table,
        summed by id, times 1/trainers; a table no loss reached sends no rows); its handle
        (``wait()`` -> {table: PushResult}). A step whose forwards left no gradient (evaluation
        under ``no_grad``) still pushes, no rows, on every trainer alike (a colocated push is collective)."""
        pending, self._pending = self._pending, []
        if self._owners_pool:
            return self._push_pooled(pending)
        grads: Dict[str, List[Tuple[torch.Tensor, Grad]]] = {c.name: [] for c in self._configs}
        if len(pending) == 1 and pending[0][2] is not None and pending[0][1][""].grad is not None:
            (handle, _), grad = pending[0][2], pending[0][1][""].grad
            return self._bound().push_stacked_async(handle, (grad * self.scale if self.scale != 1.0 else grad)
                                                    .detach().numpy())
        for routed, rows, source in pending:
            for name, leaf in rows.items():
                if leaf.grad is None:
                    continue
                grad = leaf.grad if self.scale == 1.0 else leaf.grad * self.scale  # every table's at once
                if name:
                    grads[name].append((routed.tables[name].unique, grad))
                    continue
                if source is not None:  # rows as they arrived: each table's in stacked order
                    grad = grad[source[1]]
                whole = grad.detach().numpy()  # fused: views of one array (the push sends it uncopied)
                for start, (table, part) in zip(routed.fused.starts, routed.tables.items()):
                    grads[table].append((part.unique, whole[start:start + len(part.unique)]))
        empty = {c.name: (np.empty(0, np.int64), np.empty((0, c.embedding_dim), np.float32)) for c in self._configs}
        return self._bound().push_rows_many_async(
            {name: _summed(done) if done else empty[name] for name, done in grads.items()})

    # -- rows given by a trainer that pulls and pushes itself ----------------------------
    @contextmanager
    def given_rows(self, rows: Mapping[str, Tuple[np.ndarray, np.ndarray]]) -> Iterator[Rows]:
        """Within the block forward reads, per table, rows ``values`` of its sorted unique int64
        ``ids`` (an id not among them raises) instead of pulling; yields the rows' leaf tensors
        (sharing ``values``' memory when float32, C-ordered, writeable), whose ``.grad``
        collects the row gradients. Nothing is pushed."""
        leaves, ids = {}, {}
        for config in self._configs:
            table_ids, values = rows[config.name]
            values = np.require(values, np.float32, ("C", "W"))
            if values.shape != (len(table_ids), config.embedding_dim):
                raise PSInputError(f"EmbeddingBagCollection: table {config.name!r} given rows of shape "
                                   f"{values.shape} for {len(table_ids)} ids of dimension {config.embedding_dim}")
            leaves[config.name] = torch.from_numpy(values).requires_grad_(True)
            ids[config.name] = torch.from_numpy(np.asarray(table_ids, dtype=np.int64))
        self._given, self._given_ids = leaves, ids
        try:
            yield leaves
        finally:
            self._given, self._given_ids = None, {}

    def _given_positions(self, name: str, unique: torch.Tensor) -> torch.Tensor:
        ids = self._given_ids[name]
        positions = torch.searchsorted(ids, unique).clamp_(max=max(len(ids) - 1, 0))
        if len(unique) and (not len(ids) or not torch.equal(ids[positions], unique)):
            missing = unique[~torch.isin(unique, ids)][:5].tolist()
            raise PSInputError(f"EmbeddingBagCollection: table {name!r}: ids {missing} are not among the rows given")
        return positions

    def forget_in_flight(self) -> None:
        """Forget the forwards not pushed yet and a prefetch not used (a step abandoned by a
        process failure: their requests went with the store's communicator)."""
        self._pending, self._prefetched = [], None

    def _drop_prefetched(self) -> None:
        """Finish a prefetch no forward used (its reply must land before its buffers go)."""
        if self._prefetched is not None:
            self._prefetched[1].wait()
            self._prefetched = None

    def _bound(self):
        if self.store is None:
            raise PSInputError("EmbeddingBagCollection is not bound to parameter servers: "
                               "hpcreduce.torch.start_hybrid(model, ...) binds a model's collections")
        return self.store

    def extra_repr(self) -> str:
        return ", ".join(f"{c.name}: {c.num_embeddings or 'dynamic'} x {c.embedding_dim} {c.feature_names}"
                         for c in self._configs)


class PooledRows(torch.autograd.Function):
    """Bags of rows summed (each lookup times its ``scale``), as ``F.embedding_bag`` "sum"; its
    backward adds each lookup's output gradient into its row in one compiled pass
    (``kernels.rows.pooled_grad``: the lookups' rows and bags are known from the batch's plan, no
    sort as ``embedding_bag``'s own backward does; ``index_add_`` for other dtypes)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor, bag_of: torch.Tensor,
                scale: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(inverse, bag_of, scale)
        ctx.rows_shape = rows.shape
        return F.embedding_bag(inverse, rows, offsets, mode="sum", per_sample_weights=scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        inverse, bag_of, scale = ctx.saved_tensors
        out = grad.new_zeros(ctx.rows_shape)
        grad = grad.detach().contiguous()
        if out.dtype not in (torch.float32, torch.float64) or out.dim() != 2:
            per_lookup = grad.index_select(0, bag_of)
            return out.index_add_(0, inverse, per_lookup if scale is None else per_lookup * scale.unsqueeze(1)), \
                None, None, None, None
        factors = grad.new_empty(0) if scale is None else scale.to(grad.dtype)
        POOLED_GRAD(out.numpy(), inverse.numpy(), bag_of.numpy(), grad.numpy(), factors.numpy())
        return out, None, None, None, None


def _summed(done: List[Tuple[torch.Tensor, Grad]]) -> Tuple[np.ndarray, np.ndarray]:
    """(sorted unique ids, their gradients summed) from several forwards' (one: no copy)."""
    if len(done) == 1:
        ids, grad = done[0]
    else:
        every = torch.cat([ids for ids, _ in done])
        ids, inverse = torch.unique(every, sorted=True, return_inverse=True)
        grad = torch.zeros(len(ids), done[0][1].shape[1]).index_add_(
            0, inverse, torch.cat([torch.as_tensor(g) for _, g in done]))
    return ids.numpy(), grad if isinstance(grad, np.ndarray) else grad.detach().numpy()
