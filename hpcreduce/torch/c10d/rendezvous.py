"""Rendezvous from MPI: rank, world size and torch's store, with nothing set by the user.

Under ``mpirun``, ``srun`` or ``hpcreduce launch`` (``runtime.environment.detect_launcher``) the
``env://`` rendezvous that ``init_process_group`` runs by default takes the rank and world size from
MPI; a RANK or WORLD_SIZE that is given (environment, or ``rank=``/``world_size=``) must agree with
MPI's, else every rank raises ``ConfigurationError`` naming them (``collectives.agree``). Rank 0
opens a ``TCPStore`` on a free port and broadcasts over MPI where it may be reached (loopback when
every rank shares its node; else ``HPCREDUCE_STORE_ADDR``, or the addresses its host name resolves
to, loopback last). A script that sets MASTER_ADDR itself, and any script outside an MPI launch,
keeps torch's own ``env://``; ``hpcreduce://`` names this rendezvous explicitly.
"""
from __future__ import annotations

import importlib
import os
import socket
from datetime import timedelta
from typing import Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist

from ...collectives import agree
from ...errors import ConfigurationError
from ...runtime.context import Context, init
from ...runtime.environment import detect_launcher

torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module, not the function
_TORCH_ENV = torch_rendezvous._rendezvous_handlers.get("env")
STORE_ADDRESS = "HPCREDUCE_STORE_ADDR"  # where other nodes reach rank 0's store, when its host name does not say
CONNECT = timedelta(seconds=10)  # the longest try of one offered address


def install() -> None:
    """Register the rendezvous for ``env://`` (under an MPI launch) and ``hpcreduce://``."""
    if torch_rendezvous._rendezvous_handlers.get("env") is not _mpi_or_env:
        torch_rendezvous._rendezvous_handlers.pop("env", None)
        dist.register_rendezvous_handler("env", _mpi_or_env)
    if "hpcreduce" not in torch_rendezvous._rendezvous_handlers:
        dist.register_rendezvous_handler("hpcreduce", mpi_rendezvous)


def _mpi_or_env(url: str, timeout: timedelta = dist.default_pg_timeout, **kwargs):
    if detect_launcher() == "none" or os.environ.get("MASTER_ADDR"):
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
    """A ``TCPStore`` served by rank 0 on a free port, every rank connected (collective). Rank 0
    offers the addresses it may be reached at (``store_addresses``); each rank takes the first that
    answers. A rank that cannot serve or reach the store raises on every rank, naming why."""
    comm = context.comm
    one_host = len(set(comm.allgather(socket.gethostname()))) == 1
    store: Optional[dist.TCPStore] = None
    offer: Tuple[List[str], int, Optional[str]] = ([], 0, None)
    if context.rank == 0:
        try:
            store = dist.TCPStore("127.0.0.1", 0, context.size, True, timeout=timeout, wait_for_workers=False)
            offer = (["127.0.0.1"] if one_host else store_addresses(), store.port, None)
        except (RuntimeError, OSError) as err:
            offer = ([], 0, f"rank 0 could not serve torch's store: {err}")
    addresses, port, problem = comm.bcast(offer, root=0)
    tried: List[str] = []
    for address in addresses if store is None and problem is None else ():
        try:
            store = dist.TCPStore(address, port, context.size, False, timeout=min(timeout, CONNECT))
            break
        except (RuntimeError, OSError) as err:
            tried.append(f"{address}:{port} ({err})")
    if problem is None and store is None:
        problem = ("could not reach rank 0's store at " + ", ".join(tried or ["no address"])
                   + f": set {STORE_ADDRESS} to an address of rank 0's host that every node reaches")
    agree(problem if context.rank == 0 or store is None else None, comm=context,
          what="torch's store for init_process_group", error=ConfigurationError)
    return store


def store_addresses() -> List[str]:
    """Where other nodes may reach this host: ``HPCREDUCE_STORE_ADDR`` when set, else the addresses
    its name resolves to (IPv4 first), loopback last (nodes that share one host, as a test's)."""
    given = os.environ.get(STORE_ADDRESS)
    if given:
        return [given]
    try:
        found = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        found = []
    resolved = sorted({info[4][0] for info in found}, key=lambda address: ":" in address)
    return [*(a for a in resolved if not a.startswith("127.") and a != "::1"), "127.0.0.1"]
