"""``PSEmbeddingBag``: torch's ``nn.EmbeddingBag`` whose table lives on the parameter servers.

    bag = PSEmbeddingBag("items", 16, num_embeddings=1 << 20, mode="sum")
    bag.bind(worker)                          # start_hybrid(model) binds every bag of a model
    pooled = bag(ids, offsets)                # pulls the batch's unique rows, pools them
    loss(pooled).backward()                   # the pulled rows get their gradient
    handle = bag.push()                       # one push_rows of the step's row gradients
    handle.wait(); worker.clock()

Forward pulls the batch's unique ids (sorted; one ``pull_rows`` per call, or the one
``prefetch`` started) and runs ``F.embedding_bag`` on the pulled rows, the ids remapped to
their positions, so autograd gives each pulled row its gradient. ``push()`` sends, once per
step, the gradients of every forward since the last push (rows summed by id: a bag called on
several fields, or on micro-batches, still pushes once per table per step, as the servers'
exactly-once rule needs), times ``1 / workers``: the servers' sum over workers is then the
gradient of the mean loss over the global batch, the same average ``DistributedDataParallel``
takes of the dense gradients. Cost per step: one pull and one push of the batch's unique
rows (``unique x dim`` floats each way), one ``torch.unique`` of the ids.

Given rows (``with bag.given_rows(ids, values) as rows:``): a trainer that pulls and pushes
itself (``model_adapter.TorchModel`` under ``hpcreduce.train``'s fault-tolerant hybrid
trainer) hands the bag the rows of sorted unique ``ids``; forward reads them (no worker, no
pull) and ``rows.grad`` sums every forward's row gradients. Cost: one ``searchsorted`` of the
batch's ids into ``ids``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import PSInputError
from ..ps import Dynamic, ParamSpec, dynamic_table
from ..ps.handles import Handle

MODES = ("sum", "mean", "max")


class PSEmbeddingBag(torch.nn.Module):
    """Pooled embeddings of table ``table`` (rows of ``embedding_dim`` float32) held by the
    parameter servers. ``num_embeddings``: a fixed table of that many rows (ids in
    ``[0, num_embeddings)``); None: a dynamic table keyed by any int64 id (``dynamic``: its
    admission and eviction settings). ``mode``: "sum", "mean" or "max" per bag, as
    ``nn.EmbeddingBag``. ``init_scale``: a fixed table's rows start N(0, init_scale**2).
    The module holds no parameter: its rows are pulled each forward and pushed by ``push()``."""

    def __init__(self, table: str, embedding_dim: int, num_embeddings: Optional[int] = None, *,
                 mode: str = "mean", dynamic: Optional[Dynamic] = None, init_scale: float = 0.01):
        super().__init__()
        problems = _problems(table, embedding_dim, num_embeddings, mode, dynamic, init_scale)
        if problems:
            raise PSInputError(f"PSEmbeddingBag {table!r}: " + "; ".join(problems))
        self.table, self.embedding_dim, self.num_embeddings = table, int(embedding_dim), num_embeddings
        self.mode, self.init_scale = mode, float(init_scale)
        self.dynamic = dynamic if num_embeddings is None else None
        self.worker = None
        self._pending: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (unique ids, pulled rows) per forward
        self._prefetched: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Handle]] = None
        self._given: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # (sorted unique ids, their rows)

    @property
    def spec(self) -> ParamSpec:
        """The servers' table for this bag."""
        if self.num_embeddings is None:
            return dynamic_table(self.table, self.embedding_dim, self.dynamic or Dynamic(init_scale=self.init_scale))
        return ParamSpec(self.table, (int(self.num_embeddings), self.embedding_dim), "float32", sparse=True)

    def bind(self, worker) -> "PSEmbeddingBag":
        """Pull from and push to ``worker`` (an ``hpcreduce.ps.Worker`` whose servers hold ``spec``)."""
        specs = {spec.name: spec for spec in worker.layout.specs}
        if specs.get(self.table) != self.spec:
            raise PSInputError(f"PSEmbeddingBag {self.table!r}: the servers hold "
                               f"{specs.get(self.table, 'no such table')}, this bag needs {self.spec}")
        self.worker = worker
        return self

    @contextmanager
    def given_rows(self, ids: np.ndarray, values: np.ndarray) -> Iterator[torch.Tensor]:
        """Within the block, forward reads rows ``values`` (``len(ids)`` x ``embedding_dim``) of
        the sorted unique int64 ``ids`` instead of pulling (an id not among them raises); yields
        the rows' leaf tensor (sharing ``values``' memory when it is float32, C-ordered and
        writeable), whose ``.grad`` collects the row gradients. Nothing is pushed."""
        values = np.require(values, np.float32, ("C", "W"))
        if values.shape != (len(ids), self.embedding_dim):
            raise PSInputError(f"PSEmbeddingBag {self.table!r}: given rows of shape {values.shape} for "
                               f"{len(ids)} ids of dimension {self.embedding_dim}")
        rows = torch.from_numpy(values).requires_grad_(True)
        self._given = (torch.from_numpy(np.asarray(ids, dtype=np.int64)), rows)
        try:
            yield rows
        finally:
            self._given = None

    def prefetch(self, input: torch.Tensor) -> None:
        """Start pulling ``input``'s rows now; the next forward on this very tensor uses them
        (call it for every bag before the model's forward: all pulls are in flight together;
        a no-op with given rows)."""
        if self._given is not None:
            return
        self._drop_prefetched()
        unique, local = torch.unique(input, sorted=True, return_inverse=True)
        self._prefetched = (input, unique, local, self._bound().pull_rows_async(self.table, _ids(unique)))

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Pooled rows, shaped (bags, embedding_dim): ``input`` 2-D (one bag per row) or 1-D
        with ``offsets`` (where each bag starts), as ``F.embedding_bag`` takes them."""
        if input.dtype not in (torch.int64, torch.int32):
            raise PSInputError(f"PSEmbeddingBag {self.table!r}: ids must be int64 or int32, got {input.dtype}")
        if self._given is not None:
            return F.embedding_bag(self._given_positions(input), self._given[1], offsets, mode=self.mode,
                                   per_sample_weights=per_sample_weights)
        if self._prefetched is not None and self._prefetched[0] is input:
            (_, unique, local, handle), self._prefetched = self._prefetched, None
        else:
            self._drop_prefetched()
            unique, local = torch.unique(input, sorted=True, return_inverse=True)
            handle = self._bound().pull_rows_async(self.table, _ids(unique))
        rows = torch.from_numpy(handle.wait()).to(input.device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._pending.append((unique, rows))
        return F.embedding_bag(local, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights)

    def push(self, scale: Optional[float] = None) -> Optional[Handle]:
        """Start pushing the row gradients of every forward since the last push, summed by id,
        times ``scale`` (default 1/workers); None when no forward left a gradient. Wait the
        handle before the worker's ``clock()``."""
        done = [(ids, rows.grad) for ids, rows in self._pending if rows.grad is not None]
        self._pending = []
        if not done:
            return None
        ids, grads = _summed_by_id(done)
        worker = self._bound()
        scale = 1.0 / worker.layout.worker_count if scale is None else scale
        return worker.push_rows_async(self.table, _ids(ids), (grads * scale).detach().cpu().numpy())

    def extra_repr(self) -> str:
        rows = "dynamic" if self.num_embeddings is None else self.num_embeddings
        return f"{self.table!r}, {rows}, {self.embedding_dim}, mode={self.mode!r}"

    def _given_positions(self, input: torch.Tensor) -> torch.Tensor:
        """Where each of ``input``'s ids sits among the given rows' ids."""
        ids = self._given[0]
        flat = input.reshape(-1).to("cpu", torch.int64).contiguous()
        positions = torch.searchsorted(ids, flat).clamp_(max=max(len(ids) - 1, 0))
        if flat.numel() and (not len(ids) or not torch.equal(ids[positions], flat)):
            missing = flat[~torch.isin(flat, ids)][:5].tolist()
            raise PSInputError(f"PSEmbeddingBag {self.table!r}: ids {missing} are not among the rows given "
                               f"(the model's ids_of(batch) must name every id its forward reads)")
        return positions.reshape(input.shape).to(input.device)

    def _drop_prefetched(self) -> None:
        """Finish a prefetch no forward used (its reply must land before its buffer goes)."""
        if self._prefetched is not None:
            self._prefetched[3].wait()
            self._prefetched = None

    def _bound(self):
        if self.worker is None:
            raise PSInputError(f"PSEmbeddingBag {self.table!r} is not bound to a parameter-server worker: "
                               f"hpcreduce.torch.start_hybrid(model) binds a model's bags (or bag.bind(worker))")
        return self.worker


def _ids(unique: torch.Tensor) -> np.ndarray:
    """Sorted unique ids as the int64 numpy array the worker sends."""
    return unique.detach().to("cpu", torch.int64).numpy()


def _summed_by_id(done: List[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """One gradient row per id (sorted unique) from several forwards' (ids, row gradients)."""
    if len(done) == 1:
        return done[0]
    ids = torch.cat([ids for ids, _ in done])
    grads = torch.cat([grad for _, grad in done])
    unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    return unique, grads.new_zeros((len(unique), grads.shape[1])).index_add_(0, inverse.to(grads.device), grads)


def _problems(table, embedding_dim, num_embeddings, mode, dynamic, init_scale) -> List[str]:
    """What is wrong with a bag's settings."""
    problems = []
    if not isinstance(table, str) or not table:
        problems.append(f"the table name must be a non-empty str, got {table!r}")
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
        problems.append(f"embedding_dim must be a whole number >= 1, got {embedding_dim!r}")
    if num_embeddings is not None and (isinstance(num_embeddings, bool) or not isinstance(num_embeddings, int)
                                       or num_embeddings < 1):
        problems.append(f"num_embeddings must be a whole number >= 1 or None (dynamic), got {num_embeddings!r}")
    if num_embeddings is not None and dynamic is not None:
        problems.append("dynamic settings only apply to a dynamic table (num_embeddings=None)")
    if mode not in MODES:
        problems.append(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not np.isfinite(init_scale) or init_scale < 0:
        problems.append(f"init_scale must be finite and >= 0, got {init_scale!r}")
    return problems
