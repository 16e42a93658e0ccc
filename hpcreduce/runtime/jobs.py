"""Run a command to its end as a job of its own, ended whole when it outlives its timeout.

``run_job`` starts the command in a new session and process group, which mpirun (or srun)
and the ranks it starts on this host share, and waits at most ``timeout`` seconds. A job still
running then, or when the caller is interrupted, is ended whole (``stop_job``): SIGTERM to
the group (mpirun and srun pass it on to the ranks), SIGKILL after ``grace`` seconds, then
SIGKILL to what is left of its session. A hung job becomes a timed-out result, never a stuck caller.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import IO, Mapping, Optional, Sequence

from .processes import end_session


@dataclass
class JobResult:
    """How a job ended: ``returncode`` (None when it timed out), its output (when captured)."""

    returncode: Optional[int]
    output: str
    command: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def __str__(self) -> str:
        return f"$ {self.command}\n(exit {self.returncode})\n{self.output}"


def run_job(argv: Sequence[str], *, timeout: float, env: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, output: Optional[IO] = None, grace: float = 10) -> JobResult:
    """Run ``argv`` (``env`` added to this process's environment) to its end or ``timeout``.

    Its stdout and stderr go to ``output`` when given, else they are captured as text.
    """
    capture = output is None
    child = subprocess.Popen(list(argv), stdout=subprocess.PIPE if capture else output,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=capture,
                             env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True)
    text, code = "", None
    try:
        text, _ = child.communicate(timeout=timeout) if capture else ("", child.wait(timeout=timeout))
        code = child.returncode
    except subprocess.TimeoutExpired:
        pass
    finally:  # timed out, or the caller is interrupted: end the whole job
        stop_job(child, grace)
        if capture and code is None:
            text, _ = child.communicate()
    return JobResult(code, text or "", " ".join(argv))


def stop_job(child: subprocess.Popen, grace: float = 10) -> None:
    """End a job still running: SIGTERM to its process group, SIGKILL if it lingers past
    ``grace`` seconds (at once when ``grace`` is 0); then SIGKILL whatever is left in its
    session (Open MPI's ranks leave mpirun's process group, not its session)."""
    for sig in ((signal.SIGTERM,) if grace > 0 else ()) + (signal.SIGKILL,):
        if child.poll() is not None:
            break
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            break
        try:
            child.wait(timeout=grace if sig == signal.SIGTERM else None)
        except subprocess.TimeoutExpired:
            continue
    end_session(child.pid)
