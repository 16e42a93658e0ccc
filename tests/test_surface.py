"""The public surface: what ``hpcreduce`` exports resolves, and every error a user may catch is there."""
import importlib
import inspect
import sys

import pytest

import hpcreduce
from hpcreduce import errors


def test_every_error_raised_on_purpose_is_exported():
    raised = {name for name, value in vars(errors).items()
              if inspect.isclass(value) and issubclass(value, errors.HpcreduceError)}
    assert raised <= set(hpcreduce.__all__), raised - set(hpcreduce.__all__)
    assert all(getattr(hpcreduce, name) is getattr(errors, name) for name in raised)


def test_every_exported_name_resolves():
    for name in hpcreduce.__all__:
        assert getattr(hpcreduce, name) is not None, name


@pytest.mark.parametrize("module", ["hpcreduce.collectives", "hpcreduce.collectives.allreduce",
                                    "hpcreduce.collectives.broadcast", "hpcreduce.collectives.fusion",
                                    "hpcreduce.ps", "hpcreduce.torch", "hpcreduce.train.models"])
def test_public_modules_say_what_they_export(module):
    if module == "hpcreduce.torch":
        pytest.importorskip("torch")
    imported = importlib.import_module(module)
    assert all(hasattr(imported, name) for name in imported.__all__), module


def test_digits_without_scikit_learn_name_the_extra(monkeypatch):
    from hpcreduce.train.models.mlp import digits_dataset
    for name in ("sklearn", "sklearn.datasets"):
        monkeypatch.setitem(sys.modules, name, None)  # what an absent package imports as
    with pytest.raises(hpcreduce.ConfigurationError, match=r"pip install 'hpcreduce\[digits\]'"):
        digits_dataset(0)
