"""Shared test set-up: tests/ on sys.path so test modules can import mpi_run."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
