"""The embedding model, in process: gradients by finite differences, the model contract with
dynamic tables, and learning the interaction data to near its Bayes accuracy where logistic
regression cannot (single process, rows in a store, no MPI)."""
import numpy as np
import pytest

from hpcreduce.ps.tables import Dynamic
from hpcreduce.train.model import SparseRows, checked_grads
from hpcreduce.train.models import EmbeddingModel, InteractionCTR, LogisticRegression

from single_process import train
from test_models import numeric_grad


def float64_case(fields=4, dim=3, hidden=5, examples=9):
    model = EmbeddingModel(fields, dim, hidden, dtype="float64")
    rng = np.random.default_rng(7)
    ids = rng.integers(-2**63, 2**63 - 1, size=12, dtype=np.int64)[rng.integers(0, 12, (examples, fields))]
    batch = {"ids": ids, "label": rng.integers(0, 2, examples).astype(np.float32)}
    rows = model.rows(batch)
    params = {name: value + 0.3 * rng.normal(size=value.shape) for name, value in model.init_params(1).items()}
    params["embeddings"] = SparseRows(rows["embeddings"], rng.normal(size=(len(rows["embeddings"]), dim)))
    params["linear"] = SparseRows(rows["linear"], rng.normal(size=(len(rows["linear"]), 1)))
    return model, params, batch


def test_gradients_match_finite_differences():
    model, params, batch = float64_case()  # ids repeat within and across examples
    output = model.loss_and_grads(params, batch)
    checked_grads(model, model.param_specs(), output)

    def loss():
        return model.loss_and_grads(params, batch).loss_sum

    for spec in model.param_specs():
        value = params[spec.name].values if spec.sparse else params[spec.name]
        grad = output.grads[spec.name]
        if spec.sparse:
            assert np.array_equal(grad.ids, params[spec.name].ids)
            grad = grad.values
        np.testing.assert_allclose(grad, numeric_grad(loss, value), rtol=1e-5, atol=1e-7, err_msg=spec.name)
    assert output.count == 9 and 0 <= output.correct <= 9


def test_tables_are_dynamic_and_only_dense_parameters_are_initialised():
    dynamic = Dynamic(admit_after=2, budget_bytes=1 << 20, init_scale=0.2, seed=4)
    model = EmbeddingModel(fields=6, dim=4, dynamic=dynamic)
    specs = {spec.name: spec for spec in model.param_specs()}
    assert specs["embeddings"].dynamic == dynamic and specs["embeddings"].shape == (0, 4)
    assert specs["linear"].dynamic.init_scale == 0.0 and specs["linear"].dynamic.admit_after == 2
    assert all(spec.problem() is None for spec in specs.values())
    params = model.init_params(seed=0)
    assert set(params) == {name for name, spec in specs.items() if not spec.sparse}
    assert {name: value.shape for name, value in params.items()} == {
        name: spec.shape for name, spec in specs.items() if not spec.sparse}
    assert np.array_equal(params["w1"], model.init_params(seed=0)["w1"])
    assert not np.array_equal(params["w1"], model.init_params(seed=1)["w1"])
    assert np.all(params["interaction_weights"] == 1.0) and params["w1"].shape == (15, 16)
    batch = {"ids": np.array([[5, -3], [9, 5]]), "label": np.zeros(2, np.float32)}
    rows = EmbeddingModel(fields=2).rows(batch)
    assert all(np.array_equal(ids, [-3, 5, 9]) and ids.dtype == np.int64 for ids in rows.values())


def test_extra_rows_change_nothing_and_missing_ones_are_refused():
    model, params, batch = float64_case()
    exact = model.loss_and_grads(params, batch)
    wider = dict(params)
    for name in ("embeddings", "linear"):
        table = params[name]
        wider[name] = SparseRows(np.append(table.ids, np.iinfo(np.int64).max),
                                 np.vstack([table.values, np.full((1,) + table.values.shape[1:], 9.0)]))
    output = model.loss_and_grads(wider, batch)
    assert output.loss_sum == exact.loss_sum
    assert np.array_equal(output.grads["embeddings"].ids, params["embeddings"].ids)
    missing = dict(params, linear=SparseRows(params["linear"].ids[1:], params["linear"].values[1:]))
    with pytest.raises(ValueError, match="lack ids"):
        model.loss_and_grads(missing, batch)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="fields >= 2"):
        EmbeddingModel(fields=1)
    model, params, batch = float64_case(fields=4)
    with pytest.raises(ValueError, match=r"4 fields, so a batch's ids must be \(examples, 4\); got shape \(9, 3\)"):
        model.loss_and_grads(params, {**batch, "ids": batch["ids"][:, :3]})


def test_embeddings_learn_the_interactions_to_near_bayes_where_logistic_regression_cannot():
    data = InteractionCTR(seed=0, test_examples=10_000)
    embed = train(EmbeddingModel(data.fields), data, steps=400, batch=1024, lr=0.05)
    logreg = train(LogisticRegression(20), InteractionCTR(seed=0, test_examples=10_000, hash_bits=20),
                   steps=300, batch=1024, lr=0.1)
    bayes = data.bayes_accuracy
    print(f"bayes {bayes:.4f}  embed {embed.accuracy:.4f} ({embed.seconds:.1f} s, {embed.rows}) "
          f"logreg {logreg.accuracy:.4f} ({logreg.seconds:.1f} s)")
    assert embed.accuracy > bayes - 0.015  # measured: 0.006 below after 500 steps, 0.004 after 1000
    assert logreg.accuracy < bayes - 0.03  # measured: 0.04 below, also after 1000 steps
