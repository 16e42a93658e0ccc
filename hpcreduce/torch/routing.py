"""A batch's ids per table, deduplicated once: what an ``EmbeddingBagCollection`` pulls, and how
each feature's bags read the pulled rows.

``plan(tables, features)`` checks the batch (every key names a table's feature, every table's
features are there, lengths add up, ids int64/int32 and inside a fixed table) and, per table,
joins its features' ids (several features may share a table) into one ``TableBatch``: the
sorted unique ids, each id's position among them, the bags' offsets and per-sample weights.
Cost: one compiled radix-sort unique over every fixed table's ids together (each table's shifted
past the rows of the tables before it), else one ``torch.unique`` per table; the rest are views
and concatenations.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..ps.kernels import kernel
from .embedding_configs import EmbeddingBagConfig
from .jagged import KeyedJaggedTensor

UNIQUE_INVERSE = kernel("route", "unique_inverse")  # torch.unique(sorted, return_inverse) by a radix sort
TABLE_KEYS, SPLIT_KEYS, BAG_OF = (kernel("route", name) for name in ("table_keys", "split_keys", "bag_of"))
Lookups = Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]  # ids, bag lengths (int64), factors (float32)


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
    """Every table's lookups as one sum over the tables' pulled rows stacked in table order (when
    every table has one dim and one pooling): ``inverse`` into the stack, ``offsets`` of all
    features x stride bags, ``bag_of`` each lookup's bag, ``scale`` each lookup's factor (its
    weight, 1 / its bag's length for MEAN; None: 1), ``starts`` each table's first row."""

    inverse: torch.Tensor
    offsets: torch.Tensor
    bag_of: torch.Tensor
    scale: Optional[torch.Tensor]
    starts: List[int]


@dataclass
class BatchPlan:
    """A checked batch: ``tables`` by name, ``stride`` examples, ``features`` the batch it came
    from, ``fused`` the one-lookup form (None when the tables' dims or poolings differ),
    ``verdict`` the trainers' check of it while in flight (``batch_check.Verdict``; None once settled),
    ``lookups`` per table (ids, bag lengths, factors) when the tables' owners pool (``lookups``),
    ``ended`` once settled: some trainer's data ended (``TrainPipeline``: every trainer stops)."""

    features: KeyedJaggedTensor
    stride: int
    tables: Dict[str, TableBatch]
    fused: Optional[Fused] = None
    verdict: Optional[Any] = None
    lookups: Optional[List[Lookups]] = None
    ended: bool = False


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
    slots = [[index[name] for name in config.feature_names] for config in configs]
    joined = [_joined(values, lengths, weights, starts, table_slots, stride) for table_slots in slots]
    fixed = all(config.num_embeddings is not None for config in configs)
    deduplicated = _unique_fixed(configs, joined) if fixed else \
        [(*torch.unique(ids, sorted=True, return_inverse=True), None) for ids, _, _ in joined]
    tables = {}
    for config, (ids, bag_lengths, bag_weights), (unique, inverse, _) in zip(configs, joined, deduplicated):
        if not fixed:
            _check_range(config, unique)
        offsets = torch.cumsum(bag_lengths, 0) - bag_lengths  # each bag's start (none in an empty batch)
        tables[config.name] = TableBatch(unique, inverse, offsets, bag_weights, len(config.feature_names))
    fusable = len({(c.embedding_dim, c.mode) for c in configs}) == 1 and len(configs) > 1
    if not fusable:
        return BatchPlan(features, stride, tables)
    in_key_order = [k for table_slots in slots for k in table_slots] == list(range(len(keys)))
    all_lengths = lengths if in_key_order else torch.cat([bag_lengths for _, bag_lengths, _ in joined])
    return BatchPlan(features, stride, tables, _fused(list(tables.values()), all_lengths, deduplicated[0][2],
                                                      configs[0].mode))


def lookups(configs: Sequence[EmbeddingBagConfig], features: KeyedJaggedTensor, weighted: bool) -> BatchPlan:
    """Split a checked batch by table for owners that pool whole bags (table-wise sharding): per
    table its features' ids, bag lengths and per-lookup factors (the weights; under MEAN pooling
    1 / the bag's length, as the fused lookup scales them; 1 on a SUM table beside MEAN ones;
    None for every table when none needs one). No deduplication; ids outside a fixed table:
    ``ValueError`` naming them."""
    keys, stride = features.keys(), features.stride()
    index = {key: k for k, key in enumerate(keys)}
    values, lengths = features.values().to(torch.int64), features.lengths().to(torch.int64)
    starts = torch.cumsum(torch.cat([lengths.new_zeros(1), lengths.view(len(keys), stride).sum(1)]), 0).tolist()
    weights = features.weights_or_none().to(torch.float32) if weighted else None
    scaled = weighted or any(config.mode == "mean" for config in configs)
    out = []
    for config in configs:
        ids, bag_lengths, bag_weights = _joined(values, lengths, weights, starts,
                                                [index[name] for name in config.feature_names], stride)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= config.num_embeddings):
            _check_range(config, torch.unique(ids))
        factors = bag_weights if weighted else None
        if not weighted and scaled:
            bag = torch.from_numpy(BAG_OF(np.ascontiguousarray(bag_lengths.numpy())))
            factors = (1.0 / bag_lengths.clamp(min=1).to(torch.float32))[bag] if config.mode == "mean" else \
                torch.ones(len(ids), dtype=torch.float32)
        out.append((np.ascontiguousarray(ids.numpy()), np.ascontiguousarray(bag_lengths.numpy()),
                    None if factors is None else np.ascontiguousarray(factors.numpy())))
    return BatchPlan(features, stride, {}, lookups=out)


def _unique_fixed(configs: Sequence[EmbeddingBagConfig], joined) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Fixed tables deduplicated in one compiled radix unique: table t's ids shifted by the rows
    of the tables before it (checked inside it in the same pass). Per table (unique ids,
    inverse, the inverse into every table's unique ids together: the fused lookup's)."""
    sizes = np.array([c.num_embeddings for c in configs], np.int64)
    counts = np.array([len(ids) for ids, _, _ in joined], np.int64)
    ids = torch.cat([ids for ids, _, _ in joined]) if len(joined) > 1 else joined[0][0]
    keys, outside = TABLE_KEYS(ids.numpy(), counts, sizes)
    if outside >= 0:
        first = int(np.searchsorted(np.cumsum(counts), outside, side="right"))
        _check_range(configs[first], torch.unique(joined[first][0]))
    bits = max(int(sizes.sum()) - 1, 1).bit_length()  # every key is below the tables' rows together
    unique, inverse = UNIQUE_INVERSE(keys, bits)
    local, starts = SPLIT_KEYS(unique, sizes)  # each table's own ids, one pass
    local, inverse = torch.from_numpy(local), torch.from_numpy(inverse)
    rows, values = starts.tolist(), [0] + np.cumsum(counts).tolist()
    return [(local[rows[t]:rows[t + 1]], inverse[values[t]:values[t + 1]] - rows[t], inverse)
            for t in range(len(configs))]


def _check_range(config: EmbeddingBagConfig, unique: torch.Tensor) -> None:
    """``ValueError`` naming the ids outside a fixed table (sorted unique ``unique``)."""
    rows = config.num_embeddings
    if rows is not None and len(unique) and (unique[0] < 0 or unique[-1] >= rows):
        outside = unique[(unique < 0) | (unique >= rows)][:5].tolist()
        raise ValueError(f"table {config.name!r} has {rows} rows, the batch looks up ids {outside}")


def _fused(tables: List[TableBatch], lengths: torch.Tensor, inverse: Optional[torch.Tensor], mode: str) -> Fused:
    """One lookup for all tables (``lengths``: every bag's, in table order): each table's ids
    shifted past the rows before it (``inverse``: already so, from one deduplication of every table)."""
    rows = list(accumulate([0] + [len(t.unique) for t in tables]))
    if inverse is None:
        inverse = torch.cat([t.inverse + base for t, base in zip(tables, rows)])
    offsets = torch.cumsum(lengths, 0) - lengths  # every bag's start, in table order
    bag_of = torch.from_numpy(BAG_OF(np.ascontiguousarray(lengths.numpy())))
    scale = None if tables[0].weights is None else torch.cat([t.weights for t in tables])
    if mode == "mean":
        scale = 1.0 / lengths.clamp(min=1).to(torch.float32)[bag_of]
    return Fused(inverse, offsets, bag_of, scale, rows[:-1])


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
