"""The interaction click data, in process: reproducible per example, labels that follow a
factorisation-machine truth, ids from an unbounded vocabulary."""
import numpy as np
import pytest

from hpcreduce.train.models import InteractionCTR, build


def small(**settings):
    return InteractionCTR(seed=settings.pop("seed", 3), train_examples=10_000, test_examples=4000, **settings)


def test_examples_are_reproducible_per_index_seed_and_split():
    data = small()
    whole = data.batch("train", np.arange(10))
    picked = data.batch("train", np.array([7, 2]))
    assert np.array_equal(picked["ids"], whole["ids"][[7, 2]])
    assert np.array_equal(picked["label"], whole["label"][[7, 2]])
    assert np.array_equal(small().batch("train", np.arange(10))["ids"], whole["ids"])
    assert not np.array_equal(small(seed=4).batch("train", np.arange(10))["ids"], whole["ids"])
    assert not np.array_equal(data.batch("test", np.arange(10))["ids"], whole["ids"])
    assert whole["ids"].shape == (10, data.fields) and whole["ids"].dtype == np.int64
    assert whole["label"].dtype == np.float32 and set(np.unique(whole["label"])) <= {0.0, 1.0}


def test_ids_span_int64_and_differ_between_fields():
    ids = small().batch("train", np.arange(2000))["ids"]
    assert (ids < 0).any() and (ids > 2**62).any()
    per_field = [set(column) for column in ids.T]
    assert all(not a & b for i, a in enumerate(per_field) for b in per_field[i + 1:])


def test_true_logits_are_bias_first_order_and_every_pairwise_dot_product():
    data = small(fields=5, true_bias=0.3)
    ids, _ = data.feature_ids("train", np.arange(50))
    weights = np.array([[data.true_values("true-weights", np.array([i]), 1)[0, 0] for i in row] for row in ids])
    latents = np.stack([data.true_values("true-latents", column, data.true_dim) for column in ids.T], axis=1)
    fresh = data.true_values("true-latents", np.arange(-5000, 5000), data.true_dim)  # N(0, 1) before scaling
    assert fresh.shape == (10_000, data.true_dim) and abs(fresh.std() - 1) < 0.03 and abs(fresh.mean()) < 0.03
    weights, latents = weights * data.weight_scale, latents * data.latent_scale
    pairs = sum((latents[:, i] * latents[:, j]).sum(axis=1) for i in range(5) for j in range(i + 1, 5))
    np.testing.assert_allclose(data.true_logits(ids), 0.3 + weights.sum(axis=1) + pairs, rtol=1e-12)
    # the truth is a function of the id alone: an example's fields in another order give the same logit
    np.testing.assert_allclose(data.true_logits(ids[:, ::-1]), data.true_logits(ids), rtol=1e-12)


def test_labels_follow_the_truth_and_the_pairs_carry_most_of_it():
    data = InteractionCTR(seed=0, test_examples=20_000)
    ids, labels, logits = data.generate("test", np.arange(20_000))
    probability = 1 / (1 + np.exp(-logits))
    for part in np.array_split(np.argsort(logits), 10):  # calibrated in every logit decile
        assert abs(labels[part].mean() - probability[part].mean()) < 0.04
    assert data.bayes_accuracy == np.mean((logits > 0) == (labels > 0.5))
    assert 0.78 < data.bayes_accuracy < 0.88
    first_order_only = InteractionCTR(seed=0, test_examples=20_000, interaction_scale=0.0)
    assert first_order_only.bayes_accuracy < data.bayes_accuracy - 0.1


def test_distinct_ids_keep_growing_with_the_examples_drawn():
    data = InteractionCTR(seed=1, zipf=1.5)
    info = data.info()
    few, many = info["distinct_ids"].values()
    assert many > 4 * few  # 16 times the examples: n**(1/zipf) grows about 6-fold
    assert 0.5 < info["distinct_id_growth_exponent"] < 0.8
    first = data.feature_ids("train", np.arange(1 << 14))[0]
    later = data.feature_ids("train", np.arange(1 << 20, (1 << 20) + (1 << 14)))[0]
    assert len(np.setdiff1d(later, first)) > 0.2 * len(np.unique(later))  # new ids, however far one draws
    heavy = InteractionCTR(seed=1, zipf=1.1).info()  # near 1: almost every draw a new id
    assert heavy["distinct_id_growth_exponent"] > 0.85 and heavy["distinct_ids"]["65536"] > 400_000


def test_folded_ids_keep_the_labels_and_fit_the_hashed_table():
    plain, folded = small(), small(hash_bits=10)
    a, b = plain.batch("train", np.arange(500)), folded.batch("train", np.arange(500))
    assert np.array_equal(a["label"], b["label"])
    assert b["ids"].min() >= 0 and b["ids"].max() < 1024
    assert np.array_equal(b["ids"], a["ids"] & 1023)
    assert plain.bayes_accuracy == folded.bayes_accuracy


@pytest.mark.parametrize("settings,said", [({"zipf": 1.05}, "zipf must be at least 1.06"),
                                           ({"fields": 1}, "at least 2 fields"),
                                           ({"hash_bits": 0}, "hash_bits must be from 1 to 62")])
def test_bad_settings_are_refused_by_name(settings, said):
    with pytest.raises(ValueError, match=said):
        InteractionCTR(**settings)


def test_builtins_train_on_it():
    model, data = build("embed", 0)
    assert model.name == "embed" and isinstance(data, InteractionCTR) and data.hash_bits is None
    assert model.dynamic.seed == 0 and build("embed", 5)[0].dynamic.seed == 5  # initial rows follow the seed
    logreg, hashed = build("logreg-interaction", 0, table_rows=1 << 12)
    assert logreg.hash_bits == 12 and hashed.hash_bits == 12 and hashed.fields == data.fields
    assert hashed.batch("train", np.arange(100))["ids"].max() < 1 << 12
