"""Start real MPI jobs from tests: ``mpirun`` through hpcreduce's own launcher, with a timeout.

A job that outlives its timeout is killed with its whole process group and the test
fails with its output: a hang is a bug.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

from hpcreduce.runtime import jobs
from hpcreduce.runtime.launch import build_mpirun

TESTS = Path(__file__).resolve().parent
MPI_SCRIPTS = TESTS / "mpi"
# A script run by path has its own folder first on sys.path, not the working one: without this its
# ``import hpcreduce`` would find an installed copy instead of the checkout under test.
CHECKOUT_FIRST = {"PYTHONPATH": os.pathsep.join(filter(None, (str(TESTS.parent), os.environ.get("PYTHONPATH"))))}


# mpirun's own start failing before any rank ran: not what a test tests, so it runs once more.
# Open MPI 5's PMIx server could not open its listener (seen once in six runs of the suite), or the
# daemon of a fake node (tests/multinode.py) did not report back (exit 213; seen in 2 of 14 runs,
# in two different tests; provoked in tests/test_lost_daemon.py).
DAEMON_DID_NOT_START = "A daemon failed to report back"
LAUNCHER_DID_NOT_START = ("The PMIx server's listener thread failed to start", DAEMON_DID_NOT_START)


def run_job(argv: Sequence[str], *, timeout: float, env: Optional[Dict[str, str]] = None,
            cwd: Optional[str] = None) -> jobs.JobResult:
    """Run ``argv`` as a job of its own; past ``timeout`` seconds kill it whole and fail. A job
    whose mpirun did not start (``LAUNCHER_DID_NOT_START``) is run once more, saying so."""
    for attempt in (1, 2):
        result = jobs.run_job(argv, timeout=timeout, env=env, cwd=cwd, grace=0)
        if result.timed_out:
            raise AssertionError(f"timed out after {timeout} s (a hang is a bug): {result.command}\n{result.output}")
        why = next((text for text in LAUNCHER_DID_NOT_START if text in result.output), None)
        if attempt == 2 or why is None:
            return result
        print(f"mpi_run: mpirun did not start ({why}); running it once more: {result.command}", file=sys.stderr)
    return result


def mpirun(ranks: int, script: str, *args: str, ft: bool = False, timeout: float = 120,
           env: Optional[Dict[str, str]] = None) -> jobs.JobResult:
    """Run ``tests/mpi/<script>`` (or any path) on ``ranks`` ranks under real mpirun."""
    path = Path(script) if os.path.isabs(script) else MPI_SCRIPTS / script
    # ``-m mpi4py``: an uncaught exception on one rank aborts the job (MPI_Abort) instead of
    # leaving that rank in MPI_Finalize and its peers waiting until the timeout.
    plan = build_mpirun(ranks, [sys.executable, "-m", "mpi4py", str(path), *args], ft=ft)
    return run_job(plan.argv, timeout=timeout, env={**plan.env, **CHECKOUT_FIRST, **(env or {})})


def mpirun_in_stages(ranks: int, script: str, *args: str, first_s: float = 180, later: float = 20,
                     marker: str = "stage ") -> jobs.JobResult:
    """``mpirun`` for a script that prints a ``marker`` line after each stage: a hang is a stage that
    does not end in time, and the time a stage gets follows this machine's speed now: the first
    stage (a warm-up) gets ``first_s`` seconds, each later one ``later`` times as long as it took."""
    path = MPI_SCRIPTS / script
    plan = build_mpirun(ranks, [sys.executable, "-m", "mpi4py", str(path), *args])
    child = subprocess.Popen(plan.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             stdin=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ, **plan.env, **CHECKOUT_FIRST})
    lines: "queue.Queue[Optional[str]]" = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, child.stdout), lines.put(None)], daemon=True).start()
    output, started, allowed, first = [], time.monotonic(), first_s, None
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, started + allowed - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"a stage took over {allowed:.0f} s (a hang is a bug): {plan.shell()}\n"
                                     + "".join(output)) from None
            if line is None:
                return jobs.JobResult(child.wait(), "".join(output), plan.shell())
            output.append(line)
            if line.startswith(marker):
                now = time.monotonic()
                first = now - started if first is None else first
                started, allowed = now, later * first
    finally:
        jobs.stop_job(child, 0)


def hpcreduce_cli(*args: str, timeout: float = 120, env: Optional[Dict[str, str]] = None,
                  cwd: Optional[str] = None) -> jobs.JobResult:
    """Run the ``hpcreduce`` command as a user would (``python -m hpcreduce``), the checkout's."""
    return run_job([sys.executable, "-m", "hpcreduce", *args], timeout=timeout, env={**CHECKOUT_FIRST, **(env or {})},
                   cwd=cwd)
