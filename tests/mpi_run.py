"""Start real MPI jobs from tests: ``mpirun`` through hpcreduce's own launcher, with a timeout.

A job that outlives its timeout is killed with its whole process group and the test
fails with its output: a hang is a bug.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

from hpcreduce.runtime.launch import build_mpirun

TESTS = Path(__file__).resolve().parent
MPI_SCRIPTS = TESTS / "mpi"


@dataclass
class JobResult:
    returncode: int
    output: str
    command: str

    def __str__(self) -> str:
        return f"$ {self.command}\n(exit {self.returncode})\n{self.output}"


def run_job(argv: Sequence[str], *, timeout: float, env: Optional[Dict[str, str]] = None,
            cwd: Optional[str] = None) -> JobResult:
    """Run ``argv`` in a new session; kill the whole session if it passes ``timeout`` seconds."""
    child = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        raise AssertionError(f"timed out after {timeout} s (a hang is a bug): {' '.join(argv)}\n{output}")
    return JobResult(child.returncode, output, " ".join(argv))


def mpirun(ranks: int, script: str, *args: str, ft: bool = False, timeout: float = 120,
           env: Optional[Dict[str, str]] = None) -> JobResult:
    """Run ``tests/mpi/<script>`` (or any path) on ``ranks`` ranks under real mpirun."""
    path = Path(script) if os.path.isabs(script) else MPI_SCRIPTS / script
    # ``-m mpi4py``: an uncaught exception on one rank aborts the job (MPI_Abort) instead of
    # leaving that rank in MPI_Finalize and its peers waiting until the timeout.
    plan = build_mpirun(ranks, [sys.executable, "-m", "mpi4py", str(path), *args], ft=ft)
    return run_job(plan.argv, timeout=timeout, env={**plan.env, **(env or {})})


def hpcreduce_cli(*args: str, timeout: float = 120, env: Optional[Dict[str, str]] = None,
                  cwd: Optional[str] = None) -> JobResult:
    """Run the ``hpcreduce`` command as a user would (``python -m hpcreduce``)."""
    return run_job([sys.executable, "-m", "hpcreduce", *args], timeout=timeout, env=env, cwd=cwd)
