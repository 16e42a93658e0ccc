"""The DLRM-like model and data of ``bench embeddings --parts peers`` (torch).

``DLRM``: a bottom MLP turns the dense features into a ``dim`` vector; the sparse module pools
each field's bag of ids into one ``dim`` vector (``EmbeddingBags``: a replicated
``nn.EmbeddingBag(sparse=True)`` per field; TorchRec's and hpcreduce's ``EmbeddingBagCollection``
plug in the same way, fed a ``KeyedJaggedTensor``); the pairwise dot products of those F + 1
vectors, with the bottom's output, feed a top MLP that gives one logit. ``batch_of``: a rank's
fixed batch, ids skewed towards low rows (a few hot rows per field, as real features are).
``Pipelined``: the DLRM as ``TrainPipeline`` runs a model (a batch with ``sparse_features`` in,
``(loss, loss detached)`` out: the output the benchmark reports).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

import torch

DENSE_FEATURES = 13  # as the Criteo data DLRM is known by
HIDDEN = 64
SKEW = 4.0  # ids are rows x u**SKEW: about half the lookups fall in the first 6% of rows


@dataclass(frozen=True)
class Shape:
    """The model and batch sizes every candidate shares."""

    fields: int
    rows: int
    dim: int
    bag: int
    batch: int


class EmbeddingBags(torch.nn.Module):
    """One ``nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)`` per field; ids (B, F, L) -> (B, F, dim).
    Rows drawn as TorchRec's and hpcreduce's tables draw them by default, uniform in
    +-sqrt(1 / rows) (torch's own default, N(0, 1), made the peers' losses incomparable)."""

    def __init__(self, shape: Shape):
        super().__init__()
        self.bags = torch.nn.ModuleList(torch.nn.EmbeddingBag(shape.rows, shape.dim, mode="sum", sparse=True)
                                        for _ in range(shape.fields))
        bound = (1.0 / shape.rows) ** 0.5
        with torch.no_grad():
            for bag in self.bags:
                bag.weight.uniform_(-bound, bound)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([bag(ids[:, field]) for field, bag in enumerate(self.bags)], dim=1)


class CollectionBags(torch.nn.Module):
    """The tables as one ``EmbeddingBagCollection`` (table ``t{f}`` for feature ``f{f}``, SUM
    pooling; TorchRec's or hpcreduce's, by ``module``): a ``KeyedJaggedTensor`` -> (B, F, dim).
    ``dynamic``: hpcreduce's dynamic tables (a row made when its id is first pushed)."""

    def __init__(self, shape: Shape, module: Any, dynamic: bool = False, **options):
        super().__init__()
        self.shape = shape
        rows = None if dynamic else shape.rows
        self.collection = module.EmbeddingBagCollection(
            tables=[module.EmbeddingBagConfig(num_embeddings=rows, embedding_dim=shape.dim, name=f"t{field}",
                                              feature_names=[f"f{field}"]) for field in range(shape.fields)], **options)

    def forward(self, features) -> torch.Tensor:
        return self.collection(features).values().view(-1, self.shape.fields, self.shape.dim)


def jagged(ids: torch.Tensor, module: Any):
    """ids (B, F, L) as ``module``'s ``KeyedJaggedTensor``: per feature, every example's bag of L ids."""
    batch, fields, bag = ids.shape
    return module.KeyedJaggedTensor.from_lengths_sync(keys=[f"f{field}" for field in range(fields)],
                                                      values=ids.permute(1, 0, 2).reshape(-1),
                                                      lengths=torch.full((fields * batch,), bag, dtype=torch.int32))


@dataclass
class SparseBatch:
    """A batch as a pipeline takes it."""

    dense: torch.Tensor
    sparse_features: Any
    labels: torch.Tensor


class Pipelined(torch.nn.Module):
    """``model`` (a ``DLRM``) taking a ``SparseBatch``, giving (mean log-loss, it detached)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: SparseBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.model(batch.dense, batch.sparse_features),
                                                                    batch.labels)
        return loss, loss.detach()


class DLRM(torch.nn.Module):
    """Bottom MLP, pooled embeddings (``sparse``: ids -> (B, F, dim)), dot interactions, top MLP."""

    def __init__(self, sparse: torch.nn.Module, shape: Shape):
        super().__init__()
        self.sparse = sparse
        self.bottom = torch.nn.Sequential(torch.nn.Linear(DENSE_FEATURES, HIDDEN), torch.nn.ReLU(),
                                          torch.nn.Linear(HIDDEN, shape.dim), torch.nn.ReLU())
        vectors = shape.fields + 1
        self.register_buffer("pairs", torch.triu_indices(vectors, vectors, offset=1), persistent=False)
        self.top = torch.nn.Sequential(torch.nn.Linear(shape.dim + self.pairs.shape[1], HIDDEN), torch.nn.ReLU(),
                                       torch.nn.Linear(HIDDEN, 1))

    def forward(self, dense: torch.Tensor, sparse_input) -> torch.Tensor:
        bottom = self.bottom(dense)
        vectors = torch.cat([bottom.unsqueeze(1), self.sparse(sparse_input)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([bottom, dots], dim=1)).squeeze(1)


def dense_parameters(model: DLRM) -> int:
    """Elements of the model's dense (MLP) parameters."""
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("sparse."))


def batch_of(shape: Shape, rank: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s fixed batch: dense features (B, 13), ids (B, F, L) int64, labels (B,) in {0, 1}."""
    g = torch.Generator().manual_seed(rank + 1)
    dense = torch.randn(shape.batch, DENSE_FEATURES, generator=g)
    uniform = torch.rand(shape.batch, shape.fields, shape.bag, generator=g, dtype=torch.float64)
    ids = (uniform ** SKEW * shape.rows).long().clamp_(max=shape.rows - 1)
    labels = torch.randint(0, 2, (shape.batch,), generator=g).float()
    return dense, ids, labels
