"""hpcreduce.torch.TorchModel, in one process (the adapter has no MPI of its own): a torch
module written like the numpy ``embed`` model gives that model's loss and gradients on the
same parameters; the bags read only the rows given; bad modules raise ``ModelError``."""
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hpcreduce.torch as hpt  # noqa: E402
from hpcreduce.errors import ModelError, PSInputError  # noqa: E402
from hpcreduce.ps.tables import Dynamic  # noqa: E402
from hpcreduce.train.model import SparseRows, checked_grads  # noqa: E402
from hpcreduce.train.models.embedding import DENSE, EmbeddingModel  # noqa: E402
from hpcreduce.train.models.interaction_data import InteractionCTR  # noqa: E402

FIELDS, DIM, HIDDEN = 4, 3, 5


class TorchEmbed(torch.nn.Module):
    """``embed`` in torch: per-id embeddings and linear weights (one bag each, one id a bag),
    pairwise dot products, a linear read-out of them and a relu MLP."""

    def __init__(self, dynamic: Dynamic):
        super().__init__()
        pairs = FIELDS * (FIELDS - 1) // 2
        self.embeddings = hpt.PSEmbeddingBag("embeddings", DIM, dynamic=dynamic, mode="sum")
        self.linear = hpt.PSEmbeddingBag("linear", 1, dynamic=dataclasses.replace(dynamic, init_scale=0.0),
                                         mode="sum")
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.interaction_weights = torch.nn.Parameter(torch.ones(pairs))
        self.w1 = torch.nn.Parameter(torch.randn(pairs, HIDDEN) * 0.3)
        self.b1 = torch.nn.Parameter(torch.randn(HIDDEN) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(HIDDEN) * 0.3)
        self.upper = torch.triu_indices(FIELDS, FIELDS, offset=1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        vectors = self.embeddings(ids.reshape(-1, 1)).reshape(len(ids), FIELDS, DIM)
        z = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        hidden = torch.relu(z @ self.w1 + self.b1)
        return self.bias + self.linear(ids).squeeze(1) + z @ self.interaction_weights + hidden @ self.w2


def click_loss(module, batch):
    logits = module(torch.from_numpy(batch["ids"]))
    labels = torch.from_numpy(batch["label"])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    return loss, int(((logits > 0) == (labels > 0.5)).sum()), len(labels)


def adapter(dynamic=Dynamic(init_scale=0.3)):
    torch.manual_seed(0)
    return hpt.TorchModel(TorchEmbed(dynamic), click_loss, lambda batch: {"embeddings": batch["ids"],
                                                                           "linear": batch["ids"]})


def test_gradients_equal_the_numpy_embed_models():
    model, reference = adapter(), EmbeddingModel(FIELDS, DIM, HIDDEN, Dynamic(init_scale=0.3))
    assert {(s.name, s.shape, s.dtype, s.sparse) for s in model.param_specs()} == \
        {(s.name, s.shape, s.dtype, s.sparse) for s in reference.param_specs()}
    data = InteractionCTR(1, fields=FIELDS, train_examples=1000, test_examples=100)
    batch = data.batch("train", np.arange(64))
    rows = model.rows(batch)
    assert all(np.array_equal(rows[table], ids) for table, ids in reference.rows(batch).items())
    rng = np.random.default_rng(0)
    params = {name: value for name, value in model.init_params(0).items()}
    params["embeddings"] = SparseRows(rows["embeddings"], rng.normal(0, 0.3, (len(rows["embeddings"]), DIM))
                                      .astype(np.float32))
    params["linear"] = SparseRows(rows["linear"], rng.normal(0, 0.3, (len(rows["linear"]), 1)).astype(np.float32))
    got, expected = model.loss_and_grads(params, batch), reference.loss_and_grads(params, batch)
    checked_grads(model, model.param_specs(), got)
    assert got.loss_sum == pytest.approx(expected.loss_sum, rel=1e-5)
    assert (got.correct, got.count) == (expected.correct, expected.count)
    for name, grad in expected.grads.items():
        mine = got.grads[name]
        if isinstance(grad, SparseRows):
            assert np.array_equal(mine.ids, grad.ids), name
            mine, grad = mine.values, grad.values
        np.testing.assert_allclose(mine, grad, rtol=2e-4, atol=2e-5, err_msg=name)
    assert any(np.abs(got.grads[name]).max() > 1e-3 for name in DENSE)


def test_fixed_tables_start_as_start_hybrid_starts_them_and_dense_values_as_built():
    torch.manual_seed(0)
    bag = hpt.PSEmbeddingBag("items", 2, 10, init_scale=0.5)
    head = torch.nn.Linear(2, 1)
    module = torch.nn.ModuleDict({"bag": bag, "head": head})
    model = hpt.TorchModel(module, click_loss, lambda batch: {"items": batch})
    initial = model.init_params(7)
    assert sorted(initial) == ["head.bias", "head.weight", "items"]
    assert initial["items"].shape == (10, 2) and 0.2 < initial["items"].std() < 1.0
    np.testing.assert_array_equal(initial["head.weight"], head.weight.detach().numpy())
    np.testing.assert_array_equal(model.init_params(7)["items"], initial["items"])
    assert not np.array_equal(model.init_params(8)["items"], initial["items"])
    trained = {"head.weight": np.full((1, 2), 3.0, np.float32), "head.bias": np.ones(1, np.float32)}
    model.load(trained)
    np.testing.assert_array_equal(head.weight.detach().numpy(), trained["head.weight"])


def test_a_bag_reads_only_the_rows_given_and_pulls_without_them_again():
    bag = hpt.PSEmbeddingBag("items", 2, mode="sum")
    with bag.given_rows(np.array([3, 9], np.int64), np.array([[1, 2], [10, 20]], np.float32)) as rows:
        pooled = bag(torch.tensor([[9, 3, 9]]))
        assert pooled.tolist() == [[21.0, 42.0]]
        pooled.sum().backward()
        assert rows.grad.tolist() == [[1.0, 1.0], [2.0, 2.0]]
        with pytest.raises(PSInputError, match=r"ids \[4\] are not among the rows given"):
            bag(torch.tensor([[3, 4]]))
    with pytest.raises(PSInputError, match="not bound to a parameter-server worker"):
        bag(torch.tensor([[3]]))


def test_modules_the_trainers_cannot_train_are_refused_by_name():
    def ids_of(batch):
        return {}
    double = torch.nn.ModuleList([hpt.PSEmbeddingBag("t", 2), hpt.PSEmbeddingBag("t", 2)])
    with pytest.raises(ModelError, match=r"tables \['t'\] are named by more than one"):
        hpt.TorchModel(double, click_loss, ids_of)
    halves = torch.nn.Linear(2, 2).to(torch.float16)
    with pytest.raises(ModelError, match="dense parameter 'weight' is torch.float16"):
        hpt.TorchModel(halves, click_loss, ids_of)
    model = hpt.TorchModel(torch.nn.ModuleList([hpt.PSEmbeddingBag("t", 2)]), click_loss, ids_of)
    with pytest.raises(ModelError, match=r"ids_of\(batch\) gave no ids for table\(s\) \['t'\]"):
        model.rows({})
