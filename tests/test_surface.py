"""The public surface: what ``hpcreduce`` exports resolves, and every error a user may catch is there."""
import ast
import importlib
import inspect
import sys
from pathlib import Path

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


REPO = Path(__file__).resolve().parent.parent


def test_the_package_says_its_licence_everywhere_a_user_looks():
    declared = next(keyword.value.value for node in ast.walk(ast.parse((REPO / "setup.py").read_text()))
                    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"
                    for keyword in node.keywords if keyword.arg == "license")
    assert declared == "BSD-3-Clause" and (REPO / "LICENSE").read_text().startswith("BSD 3-Clause License")
    assert "## Licence\n\nBSD 3-Clause" in (REPO / "README.md").read_text()


def test_the_docs_name_no_path_of_one_machine():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = [(page.name, word) for page in pages for word in page.read_text().split()
             if word.strip("`(").startswith(("/work/", "/root/", "/home/"))]
    assert not found, found
