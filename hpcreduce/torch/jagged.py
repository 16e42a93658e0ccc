"""TorchRec's sparse batch and pooled output, by their names: ``KeyedJaggedTensor`` and ``KeyedTensor``.

    features = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 2, 3, 7, 8]),
                                 lengths=torch.tensor([2, 1, 0, 2]))   # key-major: f0's 2 bags, then f1's
    pooled = collection(features)             # a KeyedTensor
    pooled.values()                           # (batch, dim_f0 + dim_f1), in key order
    pooled.to_dict()["f1"]                    # (batch, dim_f1)

Lengths are key-major, as TorchRec's: ``lengths[k * stride + b]`` ids of key ``k`` in example ``b``
(``offsets``, one longer, instead of them). ``weights``: one per value (per-sample weights).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from ..errors import PSInputError


class KeyedJaggedTensor:
    """Per key, a bag of ids for each of ``stride()`` examples (TorchRec's argument order)."""

    def __init__(self, keys: List[str], values: torch.Tensor, weights: Optional[torch.Tensor] = None,
                 lengths: Optional[torch.Tensor] = None, offsets: Optional[torch.Tensor] = None,
                 stride: Optional[int] = None):
        if lengths is None and offsets is None:
            raise PSInputError("KeyedJaggedTensor: give lengths or offsets")
        self._keys, self._values, self._weights = list(keys), values, weights
        self._lengths = lengths if lengths is not None else offsets[1:] - offsets[:-1]
        self._offsets = offsets
        self._stride = stride if stride is not None else (len(self._lengths) // len(self._keys) if self._keys else 0)

    @staticmethod
    def from_lengths_sync(keys: List[str], values: torch.Tensor, lengths: torch.Tensor,
                          weights: Optional[torch.Tensor] = None, stride: Optional[int] = None) -> "KeyedJaggedTensor":
        return KeyedJaggedTensor(keys, values, weights=weights, lengths=lengths, stride=stride)

    @staticmethod
    def from_offsets_sync(keys: List[str], values: torch.Tensor, offsets: torch.Tensor,
                          weights: Optional[torch.Tensor] = None, stride: Optional[int] = None) -> "KeyedJaggedTensor":
        return KeyedJaggedTensor(keys, values, weights=weights, offsets=offsets, stride=stride)

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise PSInputError("KeyedJaggedTensor: it has no weights")
        return self._weights

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = torch.cat([self._lengths.new_zeros(1), torch.cumsum(self._lengths, 0)])
        return self._offsets

    def stride(self) -> int:
        return self._stride

    def length_per_key(self) -> List[int]:
        return self._lengths.view(len(self._keys), self._stride).sum(1).tolist() if self._keys else []

    def problem(self) -> Optional[str]:
        """What makes this batch unusable (None when nothing does): lengths that do not add
        up to the values, ids that are not int64/int32, weights not one per value."""
        values, lengths = self._values, self._lengths
        if not isinstance(values, torch.Tensor) or values.dim() != 1:
            return "values must be a 1-D tensor of ids"
        if values.dtype not in (torch.int64, torch.int32):
            return f"ids (values) must be int64 or int32, got {values.dtype}"
        if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.is_floating_point():
            return "lengths must be a 1-D integer tensor"
        if len(self._keys) != len(set(self._keys)):
            return f"keys {self._keys} name a feature twice"
        if len(lengths) != len(self._keys) * self._stride:
            return f"{len(lengths)} lengths for {len(self._keys)} keys x stride {self._stride}"
        negative = torch.nonzero(lengths < 0).flatten()
        if len(negative):
            at = int(negative[0])
            key, example = (self._keys[at // self._stride], at % self._stride) if self._stride else ("?", at)
            return (f"lengths[{at}] is {int(lengths[at])} (key {key!r}, example {example}): a length is a count "
                    f"of ids, never negative ({len(negative)} negative in all)")
        if int(lengths.sum()) != len(values):
            return f"lengths add up to {int(lengths.sum())}, the values are {len(values)}"
        if self._weights is not None and tuple(self._weights.shape) != (len(values),):
            return f"weights of shape {tuple(self._weights.shape)} for {len(values)} values"
        return None

    def same_batch(self, other: "KeyedJaggedTensor") -> bool:
        """Whether ``other`` holds the same keys, lengths and ids (a prefetch is matched by content)."""
        return other is self or (other._keys == self._keys and other._values.shape == self._values.shape
                                 and torch.equal(other._lengths, self._lengths)
                                 and torch.equal(other._values, self._values))

    def __repr__(self) -> str:
        return f"KeyedJaggedTensor(keys={self._keys}, stride={self._stride}, values={len(self._values)})"


class KeyedTensor:
    """Pooled embeddings: ``values()`` (batch, sum of the keys' dims), the keys side by side in order."""

    def __init__(self, keys: List[str], length_per_key: List[int], values: torch.Tensor, key_dim: int = 1):
        self._keys, self._lengths, self._values, self._key_dim = list(keys), list(length_per_key), values, key_dim

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def length_per_key(self) -> List[int]:
        return self._lengths

    def key_dim(self) -> int:
        return self._key_dim

    def to_dict(self) -> Dict[str, torch.Tensor]:
        return dict(zip(self._keys, self._values.split(self._lengths, dim=self._key_dim)))

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.to_dict()[key]
