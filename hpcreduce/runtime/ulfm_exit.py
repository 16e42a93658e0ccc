"""Ending a ULFM job's ranks after an error without MPI_Finalize.

After ranks were lost (and others spawned), Open MPI 5.0.11's MPI_Finalize shrinks the world
in a collective that waits for ranks that are gone, and the job hung (hybrid, --replace, then
the last server lost: 4 runs in 8). The errors that end a job are raised on every rank alike,
so each rank ends on its own once every rank has said why (``end_without_finalize``):

- the ``hpcreduce`` command calls it with its exit code after printing the error;
- ``train.train`` (the library API) calls ``end_at_exit`` when a run raises under ULFM: the
  error reaches the user's script as before, and when the interpreter exits the rank ends
  there, before mpi4py's MPI_Finalize, with the code the interpreter would have exited with
  (the error uncaught: 1; ``sys.exit(N)``: N; else 0). Its handler is registered when this
  module is first imported (``hpcreduce.train``), so the atexit handlers a script registers
  after that import (they run first: last in, first out) all run before it.

Outside a ULFM job (or before MPI started) both do nothing.
"""
from __future__ import annotations

import atexit
import os
import sys
import time
from typing import List, NoReturn, Optional

from .context import Context, current

_armed: List[Optional[Context]] = []
"""The context ``end_at_exit`` was given, once it was called."""
_exit_status: List[object] = []
"""What the script passed to ``sys.exit`` once armed (a ``SystemExit``'s code)."""


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
    """Inside a ULFM job: when the interpreter exits, ``end_without_finalize`` with the code it
    exits with (armed once; it runs before MPI_Finalize and after the script's atexit handlers)."""
    if _armed or _ulfm_running() is None:
        return
    _armed.append(ctx)
    python_exit = sys.exit

    def recording_exit(status: object = None) -> NoReturn:
        _exit_status[:] = [status]
        python_exit(status)
    sys.exit = recording_exit


def exit_code(status: object) -> int:
    """The code the interpreter exits with for ``sys.exit(status)``."""
    if status is None:
        return 0
    return status if isinstance(status, int) else 1


def _at_exit() -> None:
    if _armed:
        uncaught = getattr(sys, "last_value", None) is not None
        end_without_finalize(1 if uncaught else exit_code(_exit_status[0]) if _exit_status else 0, _armed[0])


atexit.register(_at_exit)


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
