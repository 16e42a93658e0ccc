"""Rendezvous from MPI: rank, world size and torch's store, with nothing set by the user.

Under ``mpirun``, ``srun`` or ``hpcreduce launch`` (``runtime.environment.detect_launcher``) the
``env://`` rendezvous that ``init_process_group`` runs by default takes the rank and world size from
MPI; a RANK or WORLD_SIZE that is given (environment, or ``rank=``/``world_size=``) must agree with
MPI's, else every rank raises ``ConfigurationError`` naming them (``collectives.agree``). Rank 0
opens a ``TCPStore`` on a free port (loopback when every rank shares its node, else its host's
address) and broadcasts where it listens over MPI; MASTER_ADDR/MASTER_PORT are not read. Outside an
MPI launch ``env://`` is torch's own. ``hpcreduce://`` names this rendezvous explicitly.
"""
from __future__ import annotations

import importlib
import os
import socket
from datetime import timedelta
from typing import Dict, Iterator, Optional, Tuple
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist

from ...collectives import agree
from ...errors import ConfigurationError
from ...runtime.context import Context, init
from ...runtime.environment import detect_launcher

torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module, not the function
_TORCH_ENV = torch_rendezvous._rendezvous_handlers.get("env")


def install() -> None:
    """Register the rendezvous for ``env://`` (under an MPI launch) and ``hpcreduce://``."""
    if torch_rendezvous._rendezvous_handlers.get("env") is not _mpi_or_env:
        torch_rendezvous._rendezvous_handlers.pop("env", None)
        dist.register_rendezvous_handler("env", _mpi_or_env)
    if "hpcreduce" not in torch_rendezvous._rendezvous_handlers:
        dist.register_rendezvous_handler("hpcreduce", mpi_rendezvous)


def _mpi_or_env(url: str, timeout: timedelta = dist.default_pg_timeout, **kwargs):
    if detect_launcher() == "none":
        return _TORCH_ENV(url, timeout=timeout, **kwargs)
    return mpi_rendezvous(url, timeout=timeout)


def mpi_rendezvous(url: str, timeout: timedelta = dist.default_pg_timeout, **_) -> Iterator[Tuple]:
    """Yield (store, rank, world size) from MPI (collective over ``MPI_COMM_WORLD``'s duplicate)."""
    context = init()
    rank, size = context.rank, context.size
    given = given_placement(url)
    wrong = {name: value for name, value in given.items() if value != {"rank": rank, "world size": size}[name]}
    problem = None if not wrong else (
        ", ".join(f"{name} {value} ({source(name)})" for name, value in wrong.items())
        + f" disagrees with MPI's rank {rank} of {size}: unset it, or launch as many ranks")
    agree(problem, comm=context, what="init_process_group(\"hpcreduce\")", error=ConfigurationError)
    yield tcp_store(context, timeout), rank, size
    raise RuntimeError("hpcreduce rendezvous: the store was already handed out (init_process_group called again?)")


def given_placement(url: str) -> Dict[str, int]:
    """The rank and world size the user set (``rank=``/``world_size=`` in the URL, else RANK/WORLD_SIZE)."""
    query = dict(parse_qsl(urlparse(url).query))
    found = {}
    for name, key, variable in (("rank", "rank", "RANK"), ("world size", "world_size", "WORLD_SIZE")):
        text = query.get(key) or os.environ.get(variable)
        if text not in (None, "", "-1"):
            try:
                found[name] = int(text)
            except ValueError:
                found[name] = -1
    return found


def source(name: str) -> str:
    variable = {"rank": "RANK", "world size": "WORLD_SIZE"}[name]
    return f"{variable}" if os.environ.get(variable) else f"{variable.lower()}= of init_process_group"


def tcp_store(context: Context, timeout: timedelta) -> dist.TCPStore:
    """A ``TCPStore`` served by rank 0 on a free port, every rank connected (collective)."""
    comm = context.comm
    hosts = comm.allgather(socket.gethostname())
    store: Optional[dist.TCPStore] = None
    where = None
    if context.rank == 0:
        host = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(hosts[0])
        store = dist.TCPStore(host, 0, context.size, True, timeout=timeout, wait_for_workers=False)
        where = (host, store.port)
    host, port = comm.bcast(where, root=0)
    if store is None:
        store = dist.TCPStore(host, port, context.size, False, timeout=timeout)
    return store
