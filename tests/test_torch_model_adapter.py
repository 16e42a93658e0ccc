"""hpcreduce.torch.TorchModel and EmbeddingBagCollection, in one process (the adapter has no
MPI of its own): a torch module written like the numpy ``embed`` model gives that model's loss
and gradients on the same parameters; the collection reads only the rows given and pools as
nn.EmbeddingBag does (features sharing a table, weights, SUM and MEAN); bad declarations and
batches raise by name; bad modules raise ``ModelError``."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hpcreduce.torch as hpt  # noqa: E402
from hpcreduce.errors import ModelError, PSInputError  # noqa: E402
from hpcreduce.train.model import SparseRows, checked_grads  # noqa: E402
from hpcreduce.train.models.embedding import DENSE, EmbeddingModel  # noqa: E402
from hpcreduce.train.models.interaction_data import InteractionCTR  # noqa: E402

FIELDS, DIM, HIDDEN = 4, 3, 5


class TorchEmbed(torch.nn.Module):
    """``embed`` in torch: per-id embeddings and linear weights (one bag each, one id a bag),
    pairwise dot products, a linear read-out of them and a relu MLP."""

    def __init__(self):
        super().__init__()
        pairs = FIELDS * (FIELDS - 1) // 2
        bound = 0.3 * 3 ** 0.5
        self.sparse = hpt.EmbeddingBagCollection([
            hpt.EmbeddingBagConfig(None, DIM, name="embeddings", feature_names=[f"e{f}" for f in range(FIELDS)],
                                   weight_init_min=-bound, weight_init_max=bound),
            hpt.EmbeddingBagConfig(None, 1, name="linear", feature_names=[f"l{f}" for f in range(FIELDS)],
                                   weight_init_min=0.0, weight_init_max=0.0)])
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.interaction_weights = torch.nn.Parameter(torch.ones(pairs))
        self.w1 = torch.nn.Parameter(torch.randn(pairs, HIDDEN) * 0.3)
        self.b1 = torch.nn.Parameter(torch.randn(HIDDEN) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(HIDDEN) * 0.3)
        self.upper = torch.triu_indices(FIELDS, FIELDS, offset=1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pooled = self.sparse(features(ids)).values()
        vectors = pooled[:, :FIELDS * DIM].reshape(len(ids), FIELDS, DIM)
        z = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        hidden = torch.relu(z @ self.w1 + self.b1)
        return self.bias + pooled[:, FIELDS * DIM:].sum(1) + z @ self.interaction_weights + hidden @ self.w2


def features(ids: torch.Tensor) -> hpt.KeyedJaggedTensor:
    """ids (batch, FIELDS): field f's id is feature e{f} (embeddings) and l{f} (linear), one id a bag."""
    column_major = ids.t().reshape(-1)
    return hpt.KeyedJaggedTensor([f"e{f}" for f in range(FIELDS)] + [f"l{f}" for f in range(FIELDS)],
                                 torch.cat([column_major, column_major]),
                                 lengths=torch.ones(2 * ids.numel(), dtype=torch.int64))


def click_loss(module, batch):
    logits = module(torch.from_numpy(batch["ids"]))
    labels = torch.from_numpy(batch["label"])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    return loss, int(((logits > 0) == (labels > 0.5)).sum()), len(labels)


def adapter():
    torch.manual_seed(0)
    return hpt.TorchModel(TorchEmbed(), click_loss, lambda batch: features(torch.from_numpy(batch["ids"])))


def test_gradients_equal_the_numpy_embed_models():
    model, reference = adapter(), EmbeddingModel(FIELDS, DIM, HIDDEN)
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


def collection(rows=10, dim=2, **options):
    return hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(rows, dim, name="items", feature_names=["x", "y"],
                                                              **options)])


def kjt(keys=("x", "y"), values=(9, 3, 9, 4, 3), lengths=(3, 0, 1, 1), weights=None):
    return hpt.KeyedJaggedTensor(list(keys), torch.tensor(values), lengths=torch.tensor(lengths),
                                 weights=None if weights is None else torch.tensor(weights))


def test_fixed_tables_start_from_seed_table_and_id_and_dense_values_as_built():
    torch.manual_seed(0)
    module = torch.nn.ModuleDict({"sparse": collection(weight_init_min=-0.5, weight_init_max=0.5),
                                  "head": torch.nn.Linear(2, 1)})
    head = module["head"]
    model = hpt.TorchModel(module, click_loss, lambda batch: batch)
    initial = model.init_params(7)
    assert sorted(initial) == ["head.bias", "head.weight", "items"]
    assert initial["items"].shape == (10, 2) and -0.5 <= initial["items"].min() < initial["items"].max() < 0.5
    np.testing.assert_array_equal(initial["head.weight"], head.weight.detach().numpy())
    np.testing.assert_array_equal(model.init_params(7)["items"], initial["items"])
    assert not np.array_equal(model.init_params(8)["items"], initial["items"])
    trained = {"head.weight": np.full((1, 2), 3.0, np.float32), "head.bias": np.ones(1, np.float32)}
    model.load(trained)
    np.testing.assert_array_equal(head.weight.detach().numpy(), trained["head.weight"])


def test_an_init_fn_fills_the_rows_asked_for_as_under_start_hybrid():
    torch.manual_seed(0)
    module = torch.nn.ModuleDict({"sparse": collection(init_fn=lambda weight: weight.fill_(0.25)),
                                  "head": torch.nn.Linear(2, 1)})
    model = hpt.TorchModel(module, click_loss, lambda batch: batch)
    np.testing.assert_array_equal(model.init_params(7)["items"], np.full((10, 2), 0.25, np.float32))
    specs = model.param_specs()
    init = model.part_init(7, specs)  # what a server makes its shard from
    np.testing.assert_array_equal(init.rows(specs.index(specs[-1]), np.array([1, 8])), np.full((2, 2), 0.25))
    np.testing.assert_array_equal(init.dense(0, 0, 2), module["head"].weight.detach().numpy().reshape(-1))
    with pytest.raises(ModelError, match=r"table 'items': init_fn must fill the \(rows, 2\) float32 tensor"):
        hpt.TorchModel(torch.nn.ModuleList([collection(init_fn=lambda weight: weight[:1])]), click_loss, kjt)


def test_the_collection_pools_as_embedding_bags_and_reads_only_the_rows_given():
    sums, means = collection(), hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(
        10, 2, name="items", feature_names=["x", "y"], pooling=hpt.PoolingType.MEAN)])
    weighted = hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(10, 2, name="items", feature_names=["x", "y"])],
                                          is_weighted=True)
    ids, values = np.array([3, 4, 9], np.int64), np.array([[1, 2], [5, 7], [10, 20]], np.float32)
    with sums.given_rows({"items": (ids, values)}) as rows:
        pooled = sums(kjt())
        assert pooled.keys() == ["x", "y"] and pooled.values().shape == (2, 4)
        assert pooled.to_dict()["x"].tolist() == [[21.0, 42.0], [0.0, 0.0]]
        assert pooled.to_dict()["y"].tolist() == [[5.0, 7.0], [1.0, 2.0]]
        pooled.values().sum().backward()
        assert rows["items"].grad.tolist() == [[2.0, 2.0], [1.0, 1.0], [2.0, 2.0]]
        with pytest.raises(PSInputError, match=r"ids \[5\] are not among the rows given"):
            sums(kjt(values=(9, 3, 9, 5, 3)))
    with means.given_rows({"items": (ids, values)}):
        assert means(kjt()).to_dict()["x"][0].tolist() == pytest.approx([7.0, 14.0])
    with weighted.given_rows({"items": (ids, values)}):
        pooled = weighted(kjt(weights=(1.0, 0.5, 2.0, 1.0, 1.0)))
        assert pooled.to_dict()["x"][0].tolist() == [30.5, 61.0]
    with pytest.raises(PSInputError, match="not bound to parameter servers"):
        sums(kjt())


@pytest.mark.parametrize("batch, message", [
    (kjt(keys=("x", "z")), r"features \['z'\] name no table"),
    (kjt(lengths=(3, 0, 1, 2)), "lengths add up to 6, the values are 5"),
    (kjt(lengths=(3, 0, 3, -1)), r"lengths\[3\] is -1 \(key 'y', example 1\): .* never negative"),
    (kjt(values=(9, 3, 9, 4, 10)), r"10 rows, the batch looks up ids \[10\]"),
    (hpt.KeyedJaggedTensor(["x", "y"], torch.tensor([1.0, 2.0]), lengths=torch.tensor([1, 0, 1, 0])),
     "must be int64 or int32"),
    (None, "no sparse_features")])
def test_bad_batches_are_refused_by_name(batch, message):
    with collection().given_rows({"items": (np.arange(10), np.zeros((10, 2), np.float32))}) as _, \
            pytest.raises(PSInputError, match=message):
        collection().plan(batch)


def test_bad_declarations_are_refused_by_name():
    config = hpt.EmbeddingBagConfig
    with pytest.raises(PSInputError, match="table 't' is declared twice"):
        hpt.EmbeddingBagCollection([config(4, 2, name="t", feature_names=["a"]),
                                    config(4, 2, name="t", feature_names=["b"])])
    with pytest.raises(PSInputError, match="feature 'a' looks up two tables"):
        hpt.EmbeddingBagCollection([config(4, 2, name="t", feature_names=["a"]),
                                    config(4, 2, name="u", feature_names=["a"])])
    with pytest.raises(PSInputError, match="admission and eviction apply to a dynamic table only"):
        hpt.EmbeddingBagCollection([config(4, 2, name="t", feature_names=["a"], eviction=hpt.LRUEviction(1 << 20))])
    with pytest.raises(PSInputError, match="admit_probability must be in"):
        hpt.EmbeddingBagCollection([config(None, 2, name="t", feature_names=["a"],
                                           admission=hpt.ProbabilisticAdmission(1.5))])
    dynamic = config(None, 2, name="t", feature_names=["a"], admission=hpt.ThresholdAdmission(3),
                     eviction=hpt.LFUEviction(1 << 20)).dynamic(5)
    assert (dynamic.admit_after, dynamic.eviction, dynamic.budget_bytes, dynamic.seed) == (3, "lfu", 1 << 20, 5)
    assert hpt.RowOptimizer("adagrad", lr=0.0).problem() and hpt.RowOptimizer("nope", 0.1).problem()
    positional = config(4, 2, "t", hpt.DataType.FP32, ["a"], 0.5, -0.5, None)  # TorchRec's order
    assert (positional.feature_names, positional.init_range(), positional.mode) == (["a"], (-0.5, 0.5), "sum")
    for wrong, message in ((dict(pooling="none"), "unpooled lookups are TorchRec's EmbeddingCollection"),
                           (dict(pooling=hpt.PoolingType.NONE), "pooling must be PoolingType.SUM or .MEAN"),
                           (dict(data_type=hpt.DataType.FP16), "data_type must be DataType.FP32"),
                           (dict(num_embeddings_post_pruning=3), "num_embeddings_post_pruning must be None")):
        with pytest.raises(PSInputError, match=message):
            hpt.EmbeddingBagCollection([config(4, 2, name="t", feature_names=["a"], **wrong)])


def test_modules_the_trainers_cannot_train_are_refused_by_name():
    double = torch.nn.ModuleList([collection(), collection()])
    with pytest.raises(ModelError, match="holds 2 EmbeddingBagCollections"):
        hpt.TorchModel(double, click_loss, kjt)
    halves = torch.nn.Linear(2, 2).to(torch.float16)
    with pytest.raises(ModelError, match="dense parameter '0.weight' is torch.float16"):
        hpt.TorchModel(torch.nn.ModuleList([halves, collection()]), click_loss, kjt)
    model = hpt.TorchModel(torch.nn.ModuleList([collection()]), click_loss, lambda batch: kjt(keys=("x",)))
    with pytest.raises(ModelError, match=r"features_of\(batch\).*the batch has no features \['y'\]"):
        model.rows({})


def test_fixed_tables_deduplicated_together_read_their_own_rows():
    tables = hpt.EmbeddingBagCollection([hpt.EmbeddingBagConfig(5, 2, name="s", feature_names=["x"]),
                                         hpt.EmbeddingBagConfig(7, 2, name="t", feature_names=["y", "z"])])
    features = kjt(keys=("y", "x", "z"), values=(6, 0, 4, 4, 6, 0), lengths=(1, 1, 1, 1, 2, 0))
    routed = tables.plan(features)
    assert routed.tables["s"].unique.tolist() == [4] and routed.tables["t"].unique.tolist() == [0, 6]
    assert routed.fused.inverse.tolist() == [0, 0, 2, 1, 2, 1]  # x's ids, then y's and z's, into [s4, t0, t6]
    assert routed.fused.offsets.tolist() == [0, 1, 2, 3, 4, 6]  # bags in table order: x's, y's, z's
    assert routed.fused.bag_of.tolist() == [0, 1, 2, 3, 4, 4]
    s_rows, t_rows = np.arange(10, dtype=np.float32).reshape(5, 2), 100 + np.arange(14, dtype=np.float32).reshape(7, 2)
    with tables.given_rows({"s": (np.arange(5), s_rows), "t": (np.arange(7), t_rows)}):
        pooled = tables(features).to_dict()
    assert pooled["x"].tolist() == [s_rows[4].tolist(), s_rows[4].tolist()]
    assert pooled["y"].tolist() == [t_rows[6].tolist(), t_rows[0].tolist()]
    assert pooled["z"].tolist() == [(t_rows[6] + t_rows[0]).tolist(), [0.0, 0.0]]
    with pytest.raises(PSInputError, match=r"table 's' has 5 rows, the batch looks up ids \[5\]"):
        tables.plan(kjt(keys=("y", "x", "z"), values=(6, 0, 5, 4, 6, 0), lengths=(1, 1, 1, 1, 2, 0)))


@pytest.mark.parametrize("mode, weighted", [("sum", False), ("sum", True), ("mean", False)])
def test_the_fused_lookup_equals_embedding_bag_forward_and_backward(mode, weighted):
    from hpcreduce.torch.embedding_collection import PooledRows
    from hpcreduce.torch.routing import plan
    configs = [hpt.EmbeddingBagConfig(9, 3, name=n, feature_names=[f], pooling=mode) for n, f in (("s", "x"), ("t", "y"))]
    weights = (0.5, 2.0, 1.0, -1.0, 3.0, 0.25) if weighted else None
    routed = plan(configs, kjt(values=(8, 1, 8, 4, 1, 0), lengths=(3, 0, 2, 1), weights=weights), weighted)
    fused = routed.fused
    rows = torch.randn(fused.starts[-1] + len(routed.tables["t"].unique), 3, dtype=torch.float64, requires_grad=True)
    reference = rows.detach().clone().requires_grad_(True)
    target = torch.randn(4, 3, dtype=torch.float64)
    (PooledRows.apply(rows, fused.inverse, fused.offsets, fused.bag_of,
                      None if fused.scale is None else fused.scale.double()) * target).sum().backward()
    expected = torch.nn.functional.embedding_bag(fused.inverse, reference, fused.offsets, mode=mode,
                                                 per_sample_weights=torch.tensor(weights, dtype=torch.float64)
                                                 if weighted else None)
    (expected * target).sum().backward()
    assert torch.allclose(rows.grad, reference.grad)
    assert torch.allclose(PooledRows.apply(rows, fused.inverse, fused.offsets, fused.bag_of, None if fused.scale is None
                                           else fused.scale.double()), expected)
