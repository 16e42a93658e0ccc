"""Table declarations with TorchRec's names: ``EmbeddingBagConfig``, ``PoolingType``, the row
optimizer (``RowOptimizer``) and a dynamic table's admission and eviction policies.

    EmbeddingBagConfig(num_embeddings=100_000, embedding_dim=16, name="t0", feature_names=["f0"])
    EmbeddingBagConfig(None, 16, name="users", feature_names=["user"],     # dynamic: any int64 id
                       admission=ThresholdAdmission(2), eviction=LRUEviction(budget_bytes=64 << 20))

A fixed table (``num_embeddings`` rows) starts, by default, from TorchRec's default range
(uniform in +-sqrt(1 / num_embeddings), or ``weight_init_min``/``weight_init_max``), each
element a function of (seed, table, index) alone, so any number of servers makes the same
table. ``init_fn(tensor)``, as TorchRec calls it, fills each shard's rows in place instead.
A dynamic table (``num_embeddings=None``) maps onto ``hpcreduce.ps.Dynamic``: a row exists
once ``admission`` let its id in, and ``eviction`` drops the coldest past its byte budget.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np
import torch

from ..arrays.hashing import GOLDEN, mix64, name_key
from ..ps import Dynamic, ParamSpec, dynamic_table
from ..ps.kernels import kernel
from ..ps.optimizers import OPTIMIZERS

COUNTER_UNIFORM = kernel("normal", "counter_uniform")  # compiled: 26 tables x 1M x 16 in seconds


class PoolingType(Enum):
    """How a bag of rows becomes one vector (TorchRec's)."""

    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"  # unpooled (TorchRec's EmbeddingCollection): refused by EmbeddingBagConfig


class DataType(Enum):
    """A table's element type (TorchRec's names); the tables here hold FP32 rows only."""

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT64 = "INT64"
    INT32 = "INT32"
    INT8 = "INT8"
    UINT8 = "UINT8"
    INT4 = "INT4"
    INT2 = "INT2"


@dataclass(frozen=True)
class ThresholdAdmission:
    """An id gets a row on the push that sees it the ``threshold``-th time."""

    threshold: int = 1


@dataclass(frozen=True)
class ProbabilisticAdmission:
    """An id gets a row with ``probability`` on each push that sees it (a coin per sighting)."""

    probability: float = 1.0


@dataclass(frozen=True)
class LRUEviction:
    """Past ``budget_bytes`` a shard (rows, optimizer state, index; 0: unbounded) the least
    recently used rows go."""

    budget_bytes: int = 0


@dataclass(frozen=True)
class LFUEviction:
    """Past ``budget_bytes`` a shard the least frequently used rows go."""

    budget_bytes: int = 0


Admission = Union[ThresholdAdmission, ProbabilisticAdmission]
Eviction = Union[LRUEviction, LFUEviction]


@dataclass(frozen=True)
class RowOptimizer:
    """The tables' update on their shards: ``name`` one of ``hpcreduce.ps.OPTIMIZERS``
    ("sgd", "adagrad", "adam", ...) at learning rate ``lr``."""

    name: str
    lr: float

    def problem(self) -> Optional[str]:
        if self.name not in OPTIMIZERS:
            return f"sparse_optimizer {self.name!r} is not one of {', '.join(sorted(OPTIMIZERS))}"
        if not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) or self.lr <= 0:
            return f"sparse_optimizer lr must be a finite number > 0, got {self.lr!r}"
        return None


@dataclass(eq=False)
class EmbeddingBagConfig:
    """One table as TorchRec declares it (same field names and order, through ``init_fn``).
    ``num_embeddings``: rows (ids in ``[0, num_embeddings)``), or None for a dynamic table;
    ``data_type``: ``DataType.FP32`` only; ``feature_names``: the features that look up this
    table (several may share it); ``num_embeddings_post_pruning``: None only (no inference
    pruning); ``pooling``: SUM or MEAN (or "sum"/"mean"; NONE is refused);
    ``admission``/``eviction``: a dynamic table's policies (hpcreduce's)."""

    num_embeddings: Optional[int]
    embedding_dim: int
    name: str = ""
    data_type: Any = DataType.FP32
    feature_names: Sequence[str] = field(default_factory=list)
    weight_init_max: Optional[float] = None
    weight_init_min: Optional[float] = None
    num_embeddings_post_pruning: Optional[int] = None
    init_fn: Optional[Callable[[torch.Tensor], Optional[torch.Tensor]]] = None
    pooling: Union[PoolingType, str] = PoolingType.SUM
    admission: Optional[Admission] = None
    eviction: Optional[Eviction] = None

    def __post_init__(self) -> None:
        if isinstance(self.pooling, str) and self.pooling.upper() in PoolingType.__members__:
            self.pooling = PoolingType[self.pooling.upper()]
        self.feature_names = list(self.feature_names)

    @property
    def mode(self) -> str:
        """The pooling as ``F.embedding_bag``'s mode."""
        return self.pooling.value.lower()

    def problems(self) -> List[str]:
        """What is wrong with this declaration, each naming the table."""
        out = []
        rows, dim = self.num_embeddings, self.embedding_dim
        if not isinstance(self.name, str) or not self.name:
            out.append(f"a table name must be a non-empty str, got {self.name!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            out.append(f"embedding_dim must be a whole number >= 1, got {dim!r}")
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            out.append(f"num_embeddings must be a whole number >= 1 or None (a dynamic table), got {rows!r}")
        if not self.feature_names or not all(isinstance(f, str) and f for f in self.feature_names):
            out.append(f"feature_names must be a non-empty list of names, got {self.feature_names!r}")
        if not isinstance(self.pooling, PoolingType) or self.pooling is PoolingType.NONE:
            out.append(f"pooling must be PoolingType.SUM or .MEAN (or 'sum'/'mean'), got {self.pooling!r}"
                       + (" (unpooled lookups are TorchRec's EmbeddingCollection, not here)"
                          if self.pooling is PoolingType.NONE else ""))
        if getattr(self.data_type, "value", self.data_type) != DataType.FP32.value:
            out.append(f"data_type must be DataType.FP32 (the tables hold float32 rows), got {self.data_type!r}")
        if self.num_embeddings_post_pruning is not None:
            out.append(f"num_embeddings_post_pruning must be None (no inference pruning here), "
                       f"got {self.num_embeddings_post_pruning!r}")
        if rows is not None and (self.admission is not None or self.eviction is not None):
            out.append("admission and eviction apply to a dynamic table only (num_embeddings=None)")
        if self.admission is not None and not isinstance(self.admission, (ThresholdAdmission, ProbabilisticAdmission)):
            out.append(f"admission must be ThresholdAdmission or ProbabilisticAdmission, got {self.admission!r}")
        if self.eviction is not None and not isinstance(self.eviction, (LRUEviction, LFUEviction)):
            out.append(f"eviction must be LRUEviction or LFUEviction, got {self.eviction!r}")
        low, high = self.init_range()
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            out.append(f"weight_init_min/max must be finite with min <= max, got {low!r}, {high!r}")
        if not out and rows is None:
            problem = self.dynamic(0).problem()
            if problem:
                out.append(problem)
        return [f"table {self.name!r}: {p}" for p in out]

    def init_range(self) -> tuple:
        """The default uniform range of a fixed table's elements (TorchRec's)."""
        bound = math.sqrt(1.0 / self.num_embeddings) if isinstance(self.num_embeddings, int) and self.num_embeddings > 0 \
            else 0.01 * math.sqrt(3.0)
        low = -bound if self.weight_init_min is None else float(self.weight_init_min)
        high = bound if self.weight_init_max is None else float(self.weight_init_max)
        return low, high

    def dynamic(self, seed: int) -> Dynamic:
        """A dynamic table's ``ps.Dynamic``: the policies and the init range's standard deviation."""
        low, high = self.init_range()
        admission, eviction = self.admission, self.eviction
        return Dynamic(admit_after=admission.threshold if isinstance(admission, ThresholdAdmission) else 1,
                       admit_probability=admission.probability if isinstance(admission, ProbabilisticAdmission)
                       else 1.0,
                       budget_bytes=eviction.budget_bytes if eviction is not None else 0,
                       eviction="lfu" if isinstance(eviction, LFUEviction) else "lru",
                       init_scale=(high - low) / math.sqrt(12.0), seed=seed)

    def spec(self, seed: int) -> ParamSpec:
        """The servers' table."""
        if self.num_embeddings is None:
            return dynamic_table(self.name, self.embedding_dim, self.dynamic(seed))
        return ParamSpec(self.name, (int(self.num_embeddings), self.embedding_dim), "float32", sparse=True)

    def signature(self) -> tuple:
        """What every rank must declare alike (``init_fn`` by its qualified name)."""
        init = None if self.init_fn is None else getattr(self.init_fn, "__qualname__", type(self.init_fn).__name__)
        return (self.name, self.num_embeddings, self.embedding_dim, tuple(self.feature_names), self.init_range(),
                init, self.pooling, self.admission, self.eviction)


def counter_uniform(seed: int, name: str, flat: np.ndarray, low: float, high: float) -> np.ndarray:
    """Uniform [low, high) float32 values for elements ``flat`` of table ``name``, each a
    function of (seed, name, index) alone (one compiled pass, ``kernels.normal.counter_uniform``)."""
    with np.errstate(over="ignore"):
        key = mix64(np.array([seed], np.uint64) * GOLDEN ^ name_key(name))[0]
    out = np.empty(len(flat), np.float32)
    COUNTER_UNIFORM(key, np.ascontiguousarray(flat, np.int64), float(low), float(high) - float(low), out)
    return out


def init_fn_problem(config: EmbeddingBagConfig) -> Optional[str]:
    """Why ``config.init_fn`` is unusable (it must fill a (rows, dim) float32 tensor in place,
    keeping its shape and dtype), tried on a 2-row tensor; None when it is fine."""
    if config.init_fn is None:
        return None
    probe = torch.zeros(2, config.embedding_dim)
    try:
        out = config.init_fn(probe)
    except Exception as err:  # a user's function: any failure is the message
        return f"table {config.name!r}: init_fn raised {type(err).__name__}: {err}"
    result = probe if out is None else out
    if not isinstance(result, torch.Tensor) or result.shape != probe.shape or result.dtype != probe.dtype:
        shape = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
        dtype = result.dtype if isinstance(result, torch.Tensor) else ""
        return (f"table {config.name!r}: init_fn must fill the (rows, {config.embedding_dim}) float32 tensor it is "
                f"given in place, it gave {shape} {dtype}")
    return None
