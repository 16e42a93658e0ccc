"""Synthetic clicks whose truth is a factorisation machine over an unbounded id space.

Each example has one categorical value in each of ``fields`` fields, drawn with power-law
popularity ``p(v) ~ v**-zipf`` and *no upper bound* (the inverse CDF of a Pareto tail,
floored), so the distinct ids keep growing with the examples drawn, as real ones do
(about ``n**(1/zipf)`` distinct values per field in ``n`` examples). A (field, value)
pair's feature id is a 64-bit hash of it (any int64, negatives included; no collisions
to speak of). Labels follow the true model exactly:

    logit = bias + sum_i w(id_i) + sum_{i<j} <u(id_i), u(id_j)>

where an id's true weight ``w`` and latent vector ``u`` (``true_dim`` wide) are Gaussian
values drawn from a hash of (seed, id) alone: no table, so any id has them.
``first_order_scale`` and ``interaction_scale`` are the standard deviations the two sums
add to the logit (the latent vectors are scaled by the number of field pairs). With the
defaults the pairwise part dominates: logistic regression, first order only, stays clearly
below the Bayes accuracy (the true model's accuracy on the held-out split), and a model
with embeddings can approach it.

``hash_bits``: fold the ids into ``[0, 2**hash_bits)`` (the truth is still that of the
unfolded ids), for logistic regression over a fixed hashed table.

Nothing is stored: example ``i`` of a split is computed from a counter-based hash of
(seed, split, i), so a batch costs only its own examples, on any rank.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..data import Dataset
from ...arrays.hashing import GOLDEN, mix64, unit_uniform
from ...ps.init import counter_normal
from .ctr_data import SPLIT_TAGS, held_out_bayes_accuracy

SMALLEST_ZIPF = 1.06  # the rarest draw, 2**(53/(zipf-1)), stays a finite float
GROWTH_SAMPLES = (1 << 12, 1 << 16)


class InteractionCTR(Dataset):
    """Clicks from a factorisation-machine truth over unbounded Zipf ids; batches are
    ``{"ids": int64 (b, fields), "label": float32 (b,)}``. Cost per example: O(fields *
    true_dim) hashing, vectorised over the batch."""

    name = "interaction-ctr"

    def __init__(self, seed: int = 0, *, train_examples: int = 1_000_000, test_examples: int = 20_000,
                 fields: int = 16, zipf: float = 2.5, true_dim: int = 4, first_order_scale: float = 1.0,
                 interaction_scale: float = 2.5, true_bias: float = 0.0, hash_bits: Optional[int] = None):
        if not zipf >= SMALLEST_ZIPF:
            raise ValueError(f"zipf must be at least {SMALLEST_ZIPF} (below, the rarest values pass the "
                             f"largest float), got {zipf}")
        if fields < 2:
            raise ValueError(f"an interaction truth needs at least 2 fields, got {fields}")
        if hash_bits is not None and not 1 <= hash_bits <= 62:
            raise ValueError(f"hash_bits must be from 1 to 62 (or None: unfolded ids), got {hash_bits}")
        self.seed, self.fields, self.zipf, self.true_dim = seed, fields, zipf, true_dim
        self.hash_bits, self.true_bias = hash_bits, true_bias
        self.sizes = {"train": train_examples, "test": test_examples}
        self.scales = {"first_order": first_order_scale, "interaction": interaction_scale}
        seed_key = mix64(np.array([seed], np.uint64) * GOLDEN ^ np.uint64(0x1_7E4A_C710))
        self.field_salts = mix64(seed_key + (np.arange(1, fields + 1, dtype=np.uint64) << np.uint64(40)))
        self.split_keys = {split: mix64(seed_key ^ np.uint64(tag)) for split, tag in SPLIT_TAGS.items()}
        pairs = fields * (fields - 1) // 2
        # each pair's dot product has variance true_dim * s**4: the pairs add to interaction_scale**2
        latent_scale = (interaction_scale ** 2 / (pairs * true_dim)) ** 0.25
        self.weight_scale, self.latent_scale = first_order_scale / np.sqrt(fields), latent_scale

    def size(self, split: str) -> int:
        return self.sizes[split]

    def batch(self, split: str, indices: np.ndarray) -> Dict[str, np.ndarray]:
        ids, labels, _ = self.generate(split, indices)
        return {"ids": ids, "label": labels}

    def feature_ids(self, split: str, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Unfolded int64 feature ids ``(len(indices), fields)`` of examples ``indices`` and
        each example's uniform for its label draw."""
        index = np.asarray(indices).astype(np.uint64)
        example = mix64(self.split_keys[split] ^ (index * GOLDEN))
        streams = np.arange(1, self.fields + 2, dtype=np.uint64) * GOLDEN
        uniform = unit_uniform(mix64(example[:, None] + streams))
        tail = 1.0 - uniform[:, :self.fields]  # in [2**-53, 1]: value = floor(tail**(-1/(zipf-1))), no upper bound
        values = np.floor(tail ** (-1.0 / (self.zipf - 1.0)))  # whole numbers up to 2**(53/(zipf-1)), as floats
        ids = mix64(self.field_salts + values.view(np.uint64) * GOLDEN).view(np.int64)  # one id per distinct value
        return ids, uniform[:, self.fields]

    def true_logits(self, ids: np.ndarray) -> np.ndarray:
        """The true model's logit of each row of unfolded ``ids`` (float64), by the FM identity
        ``sum_{i<j} <u_i, u_j> = (|sum u|^2 - sum |u|^2) / 2``."""
        weights = self.true_values("true-weights", ids, 1)[..., 0] * self.weight_scale
        latents = self.true_values("true-latents", ids, self.true_dim) * self.latent_scale
        summed = latents.sum(axis=1)
        pairwise = 0.5 * ((summed * summed).sum(axis=1) - (latents * latents).sum(axis=(1, 2)))
        return self.true_bias + weights.sum(axis=1) + pairwise

    def true_values(self, name: str, ids: np.ndarray, width: int) -> np.ndarray:
        """N(0, 1) float64 values ``ids.shape + (width,)``, each a function of (seed, name, id,
        column) alone (``counter_normal`` of a hash of id and column): no table, any id."""
        with np.errstate(over="ignore"):
            keys = mix64(ids.view(np.uint64))[..., None] + np.arange(width, dtype=np.uint64) * GOLDEN
        return counter_normal(self.seed, name, keys, dtype="float64")

    def generate(self, split: str, indices: np.ndarray):
        """Feature ids (folded when ``hash_bits``), labels and true logits of examples ``indices``."""
        ids, uniform = self.feature_ids(split, indices)
        logits = self.true_logits(ids)
        clicked = uniform < 1.0 / (1.0 + np.exp(-logits))
        if self.hash_bits is not None:
            ids = ids & np.int64((1 << self.hash_bits) - 1)
        return ids, clicked.astype(np.float32), logits

    @cached_property
    def bayes_accuracy(self) -> float:
        """Accuracy of the true model on the held-out examples, a chunk at a time."""
        return held_out_bayes_accuracy(self)

    @cached_property
    def distinct_ids(self) -> Dict[int, int]:
        """Distinct feature ids among the first ``n`` training examples, for each ``n`` in
        ``GROWTH_SAMPLES`` (cost: generating those ids, about 0.1 s)."""
        return {count: int(len(np.unique(self.feature_ids("train", np.arange(count))[0])))
                for count in GROWTH_SAMPLES}

    def info(self) -> Dict[str, Any]:
        (small, few), (large, many) = self.distinct_ids.items()
        return {**super().info(), "fields": self.fields, "zipf": self.zipf, "true_dim": self.true_dim,
                "hash_bits": self.hash_bits, **{f"{part}_scale": scale for part, scale in self.scales.items()},
                "distinct_ids": {str(small): few, str(large): many},
                "distinct_id_growth_exponent": float(np.log(many / few) / np.log(large / small)),
                "bayes_accuracy": self.bayes_accuracy}
