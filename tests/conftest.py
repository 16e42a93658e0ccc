"""Shared test set-up: tests/ and tests/mpi on sys.path (mpi_run, the shared test models), and
the checkout's modules compiled to bytecode once per session.

The tests' jobs run the checkout's ``hpcreduce`` (``python -m hpcreduce`` from the repository,
not the copy pip installed), and a machine whose environment sets ``PYTHONDONTWRITEBYTECODE``
(these do) never caches its bytecode: each of the suite's thousands of rank processes would
compile its ~200 modules from source again, 0.5 s of a core each (a 5-rank job's start 5.5 s
instead of 4.3 s here). Python still reads a ``__pycache__`` that exists, and checks it against
the source, so the session writes it once.
"""
import compileall
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "mpi"))
sys.path.insert(0, str(TESTS))


def pytest_sessionstart(session):
    for folder in ("hpcreduce", "tests", "examples"):
        compileall.compile_dir(str(TESTS.parent / folder), quiet=1)
