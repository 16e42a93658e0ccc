"""Ending a ULFM job's ranks after an error without MPI_Finalize.

After ranks were lost (and others spawned), Open MPI 5.0.11's MPI_Finalize shrinks the world
in a collective that waits for ranks that are gone, and the job hung (hybrid, --replace, then
the last server lost: 4 runs in 8). The errors that end a job are raised on every rank alike,
so each rank ends on its own once every rank has said why (``end_without_finalize``):

- the ``hpcreduce`` command calls it with its exit code after printing the error;
- ``train.train`` (the library API) calls ``end_at_exit`` when a run raises under ULFM: the
  error reaches the user's script as before, and when the interpreter exits (the error
  uncaught: code 1; else 0) the rank ends there, before mpi4py's MPI_Finalize.

Outside a ULFM job (or before MPI started) both do nothing.
"""
from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Optional

from .context import Context, current

_armed = False


def _ulfm_running():
    """mpi4py's MPI when this process is inside a running ULFM job, else None."""
    if "mpi4py.MPI" not in sys.modules:
        return None
    from mpi4py import MPI
    from .environment import ft_enabled
    return MPI if MPI.Is_initialized() and not MPI.Is_finalized() and ft_enabled(MPI) else None


def end_without_finalize(code: int, ctx: Optional[Context] = None) -> None:
    """Inside a ULFM job, end this process with ``code`` at once, without MPI_Finalize, once
    the ranks of ``ctx`` (default: ``init``'s) are here too (``_peers_done``)."""
    MPI = _ulfm_running()
    if MPI is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    _peers_done(MPI, ctx or current())
    os._exit(code)


def end_at_exit(ctx: Optional[Context] = None) -> None:
    """Inside a ULFM job: when the interpreter exits, ``end_without_finalize`` with code 1
    if an exception went uncaught, else 0 (registered once; it runs before MPI_Finalize)."""
    global _armed
    if _armed or _ulfm_running() is None:
        return
    _armed = True
    atexit.register(lambda: end_without_finalize(1 if getattr(sys, "last_value", None) else 0, ctx))


def _peers_done(MPI, ctx: Optional[Context], limit_s: float = 10.0) -> None:
    """Wait (an ``Ibarrier`` over ``ctx``'s communicator, at most ``limit_s``) until every
    rank has printed its error too: a process that ends without MPI_Finalize may have mpirun
    end the others before they do. A failure of the barrier ends the wait."""
    if ctx is None:
        return
    try:
        request = ctx.comm.Ibarrier()
        deadline = time.monotonic() + limit_s
        while not request.Test() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # this rank's last barrier messages leave before it ends (else a peer reports a lost one)
    except MPI.Exception:
        pass
