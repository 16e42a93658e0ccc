"""Shared test set-up: tests/ and tests/mpi on sys.path (mpi_run, the shared test models)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mpi"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
