"""Built-in models and data sets, in process: gradients by finite differences, data properties."""
import numpy as np
import pytest

from hpcreduce.train.model import SparseRows
from hpcreduce.train.models import MLP, LogisticRegression, SyntheticCTR, build, digits_dataset
from hpcreduce.train.models.logreg import lookup


def numeric_grad(loss, value: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central finite differences of ``loss()`` with respect to every element of ``value``."""
    grad = np.zeros_like(value)
    for i in np.ndindex(value.shape):
        saved = value[i]
        value[i] = saved + eps
        up = loss()
        value[i] = saved - eps
        down = loss()
        value[i] = saved
        grad[i] = (up - down) / (2 * eps)
    return grad


def test_logreg_gradients_match_finite_differences():
    model = LogisticRegression(hash_bits=4, dtype="float64")  # 16 rows: ids repeat within examples
    rng = np.random.default_rng(1)
    batch = {"ids": rng.integers(0, 16, size=(9, 5)), "label": rng.integers(0, 2, 9).astype(np.float32)}
    ids = model.rows(batch)["weights"]
    assert np.array_equal(ids, np.unique(batch["ids"]))
    table = SparseRows(ids, rng.normal(size=(len(ids), 1)))
    params = {"weights": table, "bias": rng.normal(size=1)}
    output = model.loss_and_grads(params, batch)

    def loss():
        return model.loss_and_grads(params, batch).loss_sum

    assert np.array_equal(output.grads["weights"].ids, ids)
    np.testing.assert_allclose(output.grads["weights"].values, numeric_grad(loss, table.values),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(output.grads["bias"], numeric_grad(loss, params["bias"]), rtol=1e-6)
    assert output.count == 9 and 0 <= output.correct <= 9


def test_logreg_reads_extra_rows_and_refuses_missing_ones():
    model = LogisticRegression(hash_bits=4, dtype="float64")
    batch = {"ids": np.array([[3, 5], [5, 9]]), "label": np.array([1.0, 0.0], np.float32)}
    exact = {"weights": SparseRows(np.array([3, 5, 9]), np.array([[0.1], [0.2], [0.3]])), "bias": np.zeros(1)}
    wider = {"weights": SparseRows(np.array([1, 3, 5, 9, 12]), np.array([[7.0], [0.1], [0.2], [0.3], [7.0]])),
             "bias": np.zeros(1)}
    a, b = model.loss_and_grads(exact, batch), model.loss_and_grads(wider, batch)
    assert a.loss_sum == b.loss_sum
    assert np.array_equal(b.grads["weights"].ids, [3, 5, 9])
    with pytest.raises(ValueError, match="lack ids"):
        lookup(SparseRows(np.array([3, 9]), np.zeros((2, 1))), np.array([3, 5]), "weights")


def test_mlp_gradients_match_finite_differences():
    model = MLP(inputs=5, hidden=4, classes=3, dtype="float64")
    rng = np.random.default_rng(2)
    params = {name: value + 0.1 * rng.normal(size=value.shape)
              for name, value in model.init_params(seed=3).items()}
    batch = {"x": rng.normal(size=(7, 5)), "label": rng.integers(0, 3, 7)}
    output = model.loss_and_grads(params, batch)
    for spec in model.param_specs():
        expected = numeric_grad(lambda: model.loss_and_grads(params, batch).loss_sum, params[spec.name])
        np.testing.assert_allclose(output.grads[spec.name], expected, rtol=1e-6, atol=1e-8,
                                   err_msg=spec.name)


def test_mlp_initialisation_is_seeded():
    a, b, c = MLP().init_params(0), MLP().init_params(0), MLP().init_params(1)
    assert all(np.array_equal(a[name], b[name]) for name in a)
    assert not np.array_equal(a["w1"], c["w1"])
    assert {name: value.shape for name, value in a.items()} == {
        spec.name: spec.shape for spec in MLP().param_specs()}


def test_synthetic_ctr_is_reproducible_per_example():
    data = SyntheticCTR(seed=5, train_examples=1000, test_examples=300)
    whole = data.batch("train", np.arange(10))
    picked = data.batch("train", np.array([7, 2]))
    assert np.array_equal(picked["ids"], whole["ids"][[7, 2]])
    assert np.array_equal(picked["label"], whole["label"][[7, 2]])
    again = SyntheticCTR(seed=5, train_examples=1000, test_examples=300).batch("train", np.arange(10))
    assert np.array_equal(again["ids"], whole["ids"])
    other_seed = SyntheticCTR(seed=6, train_examples=1000, test_examples=300).batch("train", np.arange(10))
    assert not np.array_equal(other_seed["ids"], whole["ids"])
    assert not np.array_equal(data.batch("test", np.arange(10))["ids"], whole["ids"])
    assert whole["ids"].shape == (10, data.fields) and whole["ids"].dtype == np.int64


def test_synthetic_ctr_follows_its_true_weights():
    data = SyntheticCTR(seed=0)
    ids, labels, logits = data.generate("test", np.arange(20_000))
    assert ids.min() >= 0 and ids.max() < 2 ** 20
    assert data.info()["vocabulary"] > 1_000_000
    # Labels are Bernoulli(sigmoid(logit)): calibrated in every logit decile.
    probability = 1 / (1 + np.exp(-logits))
    for part in np.array_split(np.argsort(logits), 10):
        assert abs(labels[part].mean() - probability[part].mean()) < 0.04
    assert 0.75 < data.bayes_accuracy < 0.9
    assert data.bayes_accuracy == np.mean((logits > 0) == (labels > 0.5))


def test_digits_split_is_seeded_and_disjoint():
    a, b = digits_dataset(seed=0), digits_dataset(seed=1)
    assert a.size("train") + a.size("test") == 1797 and a.size("test") == 359
    assert not np.array_equal(a.batch("test", np.arange(5))["x"], b.batch("test", np.arange(5))["x"])
    train_rows = {row.tobytes() for row in a.splits["train"]["x"]}
    overlap = sum(row.tobytes() in train_rows for row in a.splits["test"]["x"])
    assert overlap < 10  # the digits data set itself holds a few duplicate images


def test_build_knows_the_builtin_models():
    model, data = build("logreg", 0)
    assert model.name == "logreg" and data.size("train") == 1_000_000
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        build("nope", 0)
