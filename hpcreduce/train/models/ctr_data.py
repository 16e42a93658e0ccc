"""A synthetic click-through data set with a known true logistic model.

Each example has one categorical value in each of ``fields`` fields. Field ``f``
has a vocabulary of ``V_f`` values (log-spaced from 8 to ``max_vocabulary``, about
1.4 million (field, value) pairs with the defaults) drawn with power-law popularity
``p(v) ~ v**-zipf``, as real categorical features are. Each (field, value) is hashed
to one of ``2**hash_bits`` feature ids (collisions included), so an example is the
list of its ``fields`` active ids. Labels follow the true model exactly:
``P(click) = sigmoid(bias + sum of true_weights[id])``, true weights ~ N(0, scale^2).
The true model has at most ``2**TRUE_BITS`` weights: with more hash bits, an id's true
weight is that of its low ``TRUE_BITS`` bits, so the data set costs the same memory on
every rank whatever the feature space. The Bayes accuracy (the true model's accuracy on
the held-out examples) is what a learned model can approach.

Nothing is stored: example ``i`` of a split is computed from a counter-based hash of
(seed, split, i), so a batch costs only its own examples, on any rank; a worker generates
only the examples of its own shards (``partition``: 64 fixed blocks of the split, whatever
the number of workers).
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Dict

import numpy as np

from ..data import Dataset
from ...arrays.hashing import GOLDEN, mix64, unit_uniform

WEIGHTS_STREAM = 0x5EED_0002
TRUE_BITS = 20
SPLIT_TAGS = {"train": 1, "test": 2}
BAYES_CHUNK = 8192


class SyntheticCTR(Dataset):
    """Hashed sparse features and clicks drawn from known true weights; batches are
    ``{"ids": int64 (b, fields), "label": float32 (b,)}``."""

    name = "synthetic-ctr"

    def __init__(self, seed: int = 0, *, train_examples: int = 1_000_000,
                 test_examples: int = 20_000, fields: int = 32, hash_bits: int = 20,
                 max_vocabulary: int = 400_000, zipf: float = 1.5, scale: float = 0.5,
                 true_bias: float = 0.0):
        if zipf <= 1:
            raise ValueError(f"zipf must be above 1, got {zipf}")
        self.seed, self.fields, self.hash_bits = seed, fields, hash_bits
        self.sizes = {"train": train_examples, "test": test_examples}
        self.vocabulary = np.geomspace(8, max_vocabulary, fields)
        self.zipf, self.true_bias = zipf, true_bias
        seed_key = mix64(np.array([seed], np.uint64) * GOLDEN)
        self.field_salts = mix64(seed_key + (np.arange(1, fields + 1, dtype=np.uint64) << np.uint64(40)))
        self.split_keys = {split: mix64(seed_key ^ np.uint64(tag)) for split, tag in SPLIT_TAGS.items()}
        rng = np.random.default_rng([seed, WEIGHTS_STREAM])
        true_rows = 1 << min(hash_bits, TRUE_BITS)
        self.true_weights = rng.standard_normal(true_rows, dtype=np.float32) * np.float32(scale)

    def size(self, split: str) -> int:
        return self.sizes[split]

    def batch(self, split: str, indices: np.ndarray) -> Dict[str, np.ndarray]:
        ids, labels, _ = self.generate(split, indices)
        return {"ids": ids, "label": labels}

    def generate(self, split: str, indices: np.ndarray):
        """Feature ids, labels and true logits of examples ``indices`` of ``split``."""
        index = np.asarray(indices).astype(np.uint64)
        example = mix64(self.split_keys[split] ^ (index * GOLDEN))
        streams = np.arange(1, self.fields + 2, dtype=np.uint64) * GOLDEN
        uniform = unit_uniform(mix64(example[:, None] + streams))
        exponent = 1.0 - self.zipf  # inverse CDF of p(v) ~ v**-zipf on [1, V]
        values = (1.0 + uniform[:, :self.fields] * (self.vocabulary ** exponent - 1.0)) ** (1.0 / exponent)
        values = np.floor(values).astype(np.uint64)
        mask = np.uint64((1 << self.hash_bits) - 1)
        ids = (mix64(self.field_salts + values * GOLDEN) & mask).astype(np.int64)
        true = self.true_weights[ids & (len(self.true_weights) - 1)]
        logits = true.sum(axis=1, dtype=np.float64) + self.true_bias
        clicked = uniform[:, self.fields] < 1.0 / (1.0 + np.exp(-logits))
        return ids, clicked.astype(np.float32), logits

    @cached_property
    def bayes_accuracy(self) -> float:
        """Accuracy of the true weights on the held-out examples (same examples, same labels)."""
        return held_out_bayes_accuracy(self)

    def info(self) -> Dict[str, Any]:
        return {**super().info(), "fields": self.fields, "hash_bits": self.hash_bits,
                "vocabulary": int(self.vocabulary.astype(np.int64).sum()),
                "bayes_accuracy": self.bayes_accuracy}


def held_out_bayes_accuracy(dataset) -> float:
    """Accuracy of a synthetic data set's true logits on its held-out labels, from
    ``dataset.generate("test", indices) -> (ids, labels, logits)`` a chunk at a time (never
    the whole split at once)."""
    count, correct = dataset.size("test"), 0
    for start in range(0, count, BAYES_CHUNK):
        _, labels, logits = dataset.generate("test", np.arange(start, min(start + BAYES_CHUNK, count)))
        correct += int(((logits > 0) == (labels > 0.5)).sum())
    return correct / count
