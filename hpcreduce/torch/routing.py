"""A batch's ids per table, deduplicated once: what an ``EmbeddingBagCollection`` pulls, and how
each feature's bags read the pulled rows.

``plan(tables, features)`` checks the batch (every key names a table's feature, every table's
features are there, lengths add up, ids int64/int32 and inside a fixed table) and, per table,
joins its features' ids (several features may share a table) into one ``TableBatch``: the
sorted unique ids, each id's position among them, the bags' offsets and per-sample weights.
Cost per table: one ``torch.unique`` of its ids; the rest are views and one concatenation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .embedding_configs import EmbeddingBagConfig
from .jagged import KeyedJaggedTensor


@dataclass
class TableBatch:
    """One table's part of a batch: ``unique`` sorted ids (int64), ``inverse`` each looked-up
    id's position in ``unique``, ``offsets`` where each of the features x stride bags starts,
    ``weights`` per looked-up id or None, ``features`` how many of the table's features."""

    unique: torch.Tensor
    inverse: torch.Tensor
    offsets: torch.Tensor
    weights: Optional[torch.Tensor]
    features: int


@dataclass
class Fused:
    """Every table's lookups as one ``F.embedding_bag`` over the tables' pulled rows stacked in
    table order (when every table has one dim and one pooling): ``inverse`` into the stack,
    ``offsets`` of all features x stride bags, ``weights``, ``starts`` each table's first row."""

    inverse: torch.Tensor
    offsets: torch.Tensor
    weights: Optional[torch.Tensor]
    starts: List[int]


@dataclass
class BatchPlan:
    """A checked batch: ``tables`` by name, ``stride`` examples, ``features`` the batch it came
    from, ``fused`` the one-lookup form (None when the tables' dims or poolings differ)."""

    features: KeyedJaggedTensor
    stride: int
    tables: Dict[str, TableBatch]
    fused: Optional[Fused] = None


def problem(configs: Sequence[EmbeddingBagConfig], features: KeyedJaggedTensor, weighted: bool) -> Optional[str]:
    """Why ``features`` is not a batch for these tables (None when it is)."""
    if features is None:
        return "the batch has no sparse_features (a KeyedJaggedTensor)"
    if not isinstance(features, KeyedJaggedTensor):
        return f"the sparse features must be a KeyedJaggedTensor, got {type(features).__name__}"
    wrong = features.problem()
    if wrong:
        return f"the KeyedJaggedTensor is unusable: {wrong}"
    known = {name for config in configs for name in config.feature_names}
    stray = [key for key in features.keys() if key not in known]
    if stray:
        return f"features {stray} name no table (the tables' features: {sorted(known)})"
    missing = sorted(known - set(features.keys()))
    if missing:
        return f"the batch has no features {missing}"
    if weighted and features.weights_or_none() is None:
        return "the collection is weighted (is_weighted=True) but the batch has no weights"
    if weighted and any(config.mode != "sum" for config in configs):
        return "per-sample weights need SUM pooling on every table"
    return None


def plan(configs: Sequence[EmbeddingBagConfig], features: KeyedJaggedTensor, weighted: bool) -> BatchPlan:
    """Split a checked batch by table and deduplicate each table's ids once (ids outside a
    fixed table: ``ValueError`` naming them)."""
    keys, stride = features.keys(), features.stride()
    index = {key: k for k, key in enumerate(keys)}
    values = features.values().to(torch.int64)
    lengths = features.lengths().to(torch.int64)
    starts = torch.cumsum(torch.cat([lengths.new_zeros(1), lengths.view(len(keys), stride).sum(1)]), 0).tolist()
    weights = features.weights_or_none() if weighted else None
    tables = {}
    for config in configs:
        slots = [index[name] for name in config.feature_names]
        ids, bag_lengths, bag_weights = _joined(values, lengths, weights, starts, slots, stride)
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        if config.num_embeddings is not None and len(unique) and (unique[0] < 0 or unique[-1] >= config.num_embeddings):
            outside = unique[(unique < 0) | (unique >= config.num_embeddings)][:5].tolist()
            raise ValueError(f"table {config.name!r} has {config.num_embeddings} rows, the batch looks up ids {outside}")
        offsets = torch.cumsum(torch.cat([bag_lengths.new_zeros(1), bag_lengths[:-1]]), 0)
        tables[config.name] = TableBatch(unique, inverse, offsets, bag_weights, len(slots))
    fusable = len({(c.embedding_dim, c.mode) for c in configs}) == 1 and len(configs) > 1
    return BatchPlan(features, stride, tables, _fused(list(tables.values())) if fusable else None)


def _fused(tables: List[TableBatch]) -> Fused:
    """One lookup for all tables: each table's ids shifted past the rows (and values) before it."""
    rows = torch.tensor([0] + [len(t.unique) for t in tables]).cumsum(0).tolist()
    values = torch.tensor([0] + [len(t.inverse) for t in tables]).cumsum(0).tolist()
    inverse = torch.cat([t.inverse + base for t, base in zip(tables, rows)])
    offsets = torch.cat([t.offsets + base for t, base in zip(tables, values)])
    weights = None if tables[0].weights is None else torch.cat([t.weights for t in tables])
    return Fused(inverse, offsets, weights, rows[:-1])


def _joined(values: torch.Tensor, lengths: torch.Tensor, weights: Optional[torch.Tensor], starts: List[int],
            slots: List[int], stride: int) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The ids, bag lengths and weights of features ``slots`` (key positions) one after another."""
    if slots == list(range(slots[0], slots[0] + len(slots))):  # contiguous keys: views, no copy
        first, last = slots[0], slots[-1]
        span = slice(starts[first], starts[last + 1])
        return (values[span], lengths[first * stride:(last + 1) * stride],
                None if weights is None else weights[span])
    ids = torch.cat([values[starts[k]:starts[k + 1]] for k in slots])
    bag_lengths = torch.cat([lengths[k * stride:(k + 1) * stride] for k in slots])
    bag_weights = None if weights is None else torch.cat([weights[starts[k]:starts[k + 1]] for k in slots])
    return ids, bag_lengths, bag_weights
