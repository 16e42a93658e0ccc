"""A model's gradients are checked against its parameters before training uses them (no MPI)."""
import numpy as np
import pytest

from hpcreduce.errors import ModelError
from hpcreduce.train.model import SparseRows, StepOutput, checked_grads
from hpcreduce.train.models import LogisticRegression

MODEL = LogisticRegression(hash_bits=4)
SPECS = MODEL.param_specs()
F32 = np.float32


def good():
    return {"weights": SparseRows(np.array([2, 9]), np.ones((2, 1), F32)), "bias": np.ones(1, F32)}


def spoiled(**changes):
    grads = good()
    for name, value in changes.items():
        if value is None:
            del grads[name]
        else:
            grads[name] = value
    return StepOutput(1.0, grads, 0, 1)


def test_matching_gradients_pass_as_they_are():
    output = StepOutput(1.0, good(), 0, 1)
    assert checked_grads(MODEL, SPECS, output) is output.grads
    unsorted = spoiled(weights=SparseRows(np.array([9, 2], np.uint64), np.ones((2, 1), F32)))
    checked_grads(MODEL, SPECS, unsorted)  # unique ids in any order and integer dtype are fine
    checked_grads(MODEL, SPECS, spoiled(weights=SparseRows(np.zeros(0, np.int64), np.ones((0, 1), F32))))


@pytest.mark.parametrize("output,said", [
    (spoiled(bias=None), "no gradient for parameter(s) ['bias']"),
    (StepOutput(1.0, {**good(), "extra": np.ones(1, F32)}, 0, 1), "unknown parameter(s) ['extra']"),
    ((1.0, good()), "returned tuple with grads of type NoneType"),
    (spoiled(bias=np.ones((), F32)), "'bias' that has shape (); the parameter needs (1,)"),
    (spoiled(bias=np.ones(1)), "'bias' that has dtype float64; the parameter is float32"),
    (spoiled(bias=[1.0]), "'bias' that has type list, not an array"),
    (spoiled(bias=SparseRows(np.array([0]), np.ones(1, F32))), "'bias' that is a SparseRows"),
    (spoiled(weights=np.ones((16, 1), F32)), "'weights' that is a ndarray; a sparse parameter's must be SparseRows"),
    (spoiled(weights=SparseRows(np.array([2, 2]), np.ones((2, 1), F32))), "'weights' that has repeated row ids"),
    (spoiled(weights=SparseRows(np.array([2, 16]), np.ones((2, 1), F32))), "row ids outside [0, 16)"),
    (spoiled(weights=SparseRows(np.array([-1, 2]), np.ones((2, 1), F32))), "row ids outside [0, 16)"),
    (spoiled(weights=SparseRows(np.array([2**64 - 1], np.uint64), np.ones((1, 1), F32))), "outside [0, 16)"),
    (spoiled(weights=SparseRows(np.array([1.0, 2.0]), np.ones((2, 1), F32))), "ids of dtype float64"),
    (spoiled(weights=SparseRows([1, 2], np.ones((2, 1), F32))), "has ids of type list, not an array"),
    (spoiled(weights=SparseRows(np.array([1, 2]), np.ones((2, 3), F32))), "values of shape (2, 3)"),
])
def test_gradients_that_do_not_match_are_refused_naming_model_and_parameter(output, said):
    with pytest.raises(ModelError, match="model 'logreg': loss_and_grads") as caught:
        checked_grads(MODEL, SPECS, output)
    assert said in str(caught.value)
