"""The runtime context: hpcreduce's own communicator and what the launch can do.

The library never communicates on the user's communicator: ``init()`` duplicates
``MPI.COMM_WORLD``, and a communicator passed to a collective is duplicated once,
on first use, and the duplicate is cached on it as an MPI attribute (freed with it).
After a failure or growth the fault-tolerance layer swaps in a new communicator
with ``Context.replace_comm``; everything cached for the old one is dropped.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Dict, NoReturn, Optional, Union

from mpi4py import MPI

from ..errors import FaultToleranceUnavailableError, UnsupportedInputError
from . import environment
from .failures import abort_job, release
from .spawn import merge_with_parent


@dataclass
class Traffic:
    """Payload bytes this rank sent and received through hpcreduce (headers excluded)."""

    sent: int = 0
    received: int = 0

    def add(self, sent: int, received: int) -> None:
        self.sent += sent
        self.received += received


class Context:
    """hpcreduce's view of one group of ranks.

    ``comm`` is hpcreduce's private intracommunicator; ``rank`` and ``size`` follow it,
    so they change when the fault-tolerance layer replaces it.
    """

    def __init__(self, comm: MPI.Intracomm, *, ft: bool, cuda_aware: bool, launcher: str,
                 joined: bool = False):
        self.comm = comm
        self.joined = joined
        self.ft = ft
        self.cuda_aware = cuda_aware
        self.launcher = launcher
        self.cache: Dict[str, Any] = {}
        self.traffic = Traffic()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def replace_comm(self, comm: MPI.Intracomm) -> None:
        """Make ``comm`` this context's communicator (after shrink or growth), and drop the old
        one (freed, or kept when revoked: ``failures.release``) and everything cached for it."""
        if self.ft:
            comm.Set_errhandler(MPI.ERRORS_RETURN)
        old, self.comm = self.comm, comm
        self.cache.clear()
        release(old)

    def __repr__(self) -> str:
        return (f"Context(rank={self.rank}, size={self.size}, launcher={self.launcher!r}, "
                f"ft={self.ft}, cuda_aware={self.cuda_aware})")


Comm = Union[None, Context, MPI.Intracomm]
"""What a collective or a PS job runs over: hpcreduce's default context (None), a context,
or a user's intracommunicator (hpcreduce works on its own duplicate of it)."""

_default: Optional[Context] = None
_dup_keyval: Optional[int] = None


def init(*, ft: Optional[bool] = None, cuda_aware: Optional[bool] = None) -> Context:
    """Return the process's context around a duplicate of ``MPI.COMM_WORLD`` (collective).

    ``ft=None`` turns fault tolerance on when the launch supports it; ``ft=True`` raises
    ``FaultToleranceUnavailableError`` (on every rank) when it does not. ``cuda_aware``
    forces the GPU path (direct or staged); ``None`` asks the MPI library.
    In a process spawned to join a running job the context is over the communicator
    merged with that job (``joined`` is True). Calling it again returns the same context.
    """
    global _default
    if _default is not None:
        return _default
    start_mpi()
    settings = agreed_launch_settings(ft=ft, cuda_aware=cuda_aware)
    comm = merge_with_parent()
    joined = comm is not None
    if comm is None:
        comm = MPI.COMM_WORLD.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
    _default = Context(comm, joined=joined, **settings)
    return _default


def current() -> Optional[Context]:
    """The process's context when ``init`` made one, else None (nothing started)."""
    return _default


def start_mpi() -> None:
    """Initialise MPI (with MPI_THREAD_MULTIPLE) if the importer of mpi4py did not:
    the ``hpcreduce`` command defers it to the commands that run as ranks."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)


def agreed_launch_settings(*, ft: Optional[bool] = None, cuda_aware: Optional[bool] = None) -> Dict[str, Any]:
    """``launch_settings``, with ``ft=True``'s verdict agreed over ``MPI.COMM_WORLD`` (one
    allgather): ranks on different nodes may see different launch variables, and a refusal on
    some ranks only would leave the others waiting for them."""
    if not ft:
        return launch_settings(ft=ft, cuda_aware=cuda_aware)
    settings, refusal = None, None
    try:
        settings = launch_settings(ft=ft, cuda_aware=cuda_aware)
    except FaultToleranceUnavailableError as err:
        refusal = str(err)
    refusals = MPI.COMM_WORLD.allgather(refusal)
    refused = [rank for rank, text in enumerate(refusals) if text]
    if refused:
        ranks = "every rank" if len(refused) == len(refusals) else f"rank(s) {', '.join(map(str, refused))}"
        raise FaultToleranceUnavailableError(f"{refusals[refused[0]]} (on {ranks})")
    return settings


def launch_settings(*, ft: Optional[bool] = None, cuda_aware: Optional[bool] = None) -> Dict[str, Any]:
    """What this launch can do, decided locally (the same on every rank, no communication)."""
    problem = environment.failure_detection_problem()
    if not environment.ulfm_supported(MPI):
        problem = "this MPI library has no ULFM (MPIX_Comm_revoke)"
    if ft and problem is not None:
        raise FaultToleranceUnavailableError(f"fault tolerance was asked for, but {problem}")
    return {
        "ft": problem is None if ft is None else bool(ft),
        "cuda_aware": environment.cuda_aware(MPI) if cuda_aware is None else bool(cuda_aware),
        "launcher": environment.detect_launcher(),
    }


def resolve(comm: Comm) -> Context:
    """The context a collective runs on: the default one, the one given, or the
    private duplicate of a user's communicator (made on first use, collectively over
    that communicator, and cached on it as an attribute). Anything else (a str, an
    intercommunicator, ``COMM_NULL``): see ``refuse_comm``."""
    if comm is None:
        return init()
    if isinstance(comm, Context):
        return comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        refuse_comm(comm)
    global _dup_keyval
    if _dup_keyval is None:
        _dup_keyval = MPI.Comm.Create_keyval(delete_fn=_free_duplicate)
    cached = comm.Get_attr(_dup_keyval)
    if cached is None:
        settings = {"ft": _default.ft, "cuda_aware": _default.cuda_aware, "launcher": _default.launcher} \
            if _default is not None else launch_settings()
        dup = comm.Dup()
        dup.Set_errhandler(MPI.ERRORS_RETURN)
        cached = Context(dup, **settings)
        comm.Set_attr(_dup_keyval, cached)
    return cached


def refuse_comm(comm: object) -> NoReturn:
    """An unusable ``comm=`` (a str, an intercommunicator, ``COMM_NULL``): in a one-rank job,
    raise ``UnsupportedInputError``; in a larger job, print that error and abort the job
    (``MPI_Abort``). The other ranks may be waiting in a collective on a communicator this
    rank cannot name, so raising here alone would leave them hung; ending the job is the
    answer that never hangs."""
    start_mpi()
    world = MPI.COMM_WORLD
    kind = ("an intercommunicator" if isinstance(comm, MPI.Intercomm) else
            "MPI.COMM_NULL (or a freed communicator)" if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL
            else f"a {type(comm).__name__}")
    message = (f"rank {world.Get_rank()} passed comm={comm!r}, {kind}: comm= must be None, "
               "an hpcreduce Context or an MPI intracommunicator")
    if world.Get_size() > 1:
        sys.stderr.write(f"hpcreduce: UnsupportedInputError: {message}; its peers cannot be told on a "
                         "communicator it cannot name, so it aborts the job\n")
        sys.stderr.flush()
        abort_job(1)
    raise UnsupportedInputError(message)


def _free_duplicate(_comm: MPI.Comm, _keyval: int, context: Context) -> None:
    if context.comm != MPI.COMM_NULL:
        context.comm.Free()
