"""Where a job's ranks may run: the hosts and slots of an Open MPI hostfile, whether its names
resolve, and whether a launch without one keeps every rank on this host.

Free of mpi4py, as ``launch`` (its main user) is.
"""
from __future__ import annotations

import os
import socket
from typing import List, Optional, Sequence

from ..errors import LaunchError
from .given_files import read_regular

_ELSEWHERE = ("PBS_NODEFILE", "LSB_HOSTS", "PE_HOSTFILE", "HPCREDUCE_SPAWN_INFO")
"""What may put ranks on other hosts without a hostfile, besides a Slurm allocation of several
nodes: another scheduler's allocation, spawn info naming hosts (``runtime.spawn``)."""


MAX_HOSTFILE = 1 << 20  # the most bytes of a hostfile (a regular file: a FIFO or a device is refused)


def hostfile_lines(path: str) -> List[List[str]]:
    """The words of each non-empty line of an Open MPI hostfile (comments dropped), read within bounds."""
    try:
        text = read_regular(path, MAX_HOSTFILE).decode("utf-8")
    except (OSError, ValueError) as err:
        raise LaunchError(f"cannot read hostfile {path}: {err}") from err
    return [words for words in (line.split("#", 1)[0].split() for line in text.splitlines()) if words]


def hostfile_slots(path: str) -> Optional[int]:
    """Total slots declared in an Open MPI hostfile, or None when a host declares none."""
    total = 0
    for words in hostfile_lines(path):
        slots = [w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "max_slots="))]
        if not slots:
            return None
        try:
            total += int(slots[0])
        except ValueError as err:
            raise LaunchError(f"hostfile {path} has a slots= value that is not a number") from err
    return total


def hostfile_hosts(path: str) -> List[str]:
    """The host names of an Open MPI hostfile, in order."""
    return [words[0] for words in hostfile_lines(path)]


def unknown_hosts(path: str, extra_args: Sequence[str] = ()) -> List[str]:
    """Hosts of hostfile ``path`` that do not resolve, checked before mpirun tries to reach
    them; none when an ssh agent is set (``plm_ssh_agent``), which decides what a name means."""
    agent = any("plm_ssh_agent" in key for key in os.environ) or "plm_ssh_agent" in extra_args
    if agent:
        return []
    unknown = []
    for host in hostfile_hosts(path):
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError):
            unknown.append(host)
    return unknown


def this_host_only(extra_args: Sequence[str]) -> bool:
    """Whether a launch without a hostfile keeps every rank on this host (see ``_ELSEWHERE``),
    and nothing set chooses the tcp interfaces already."""
    chosen = [arg for arg in (*extra_args, *os.environ) if "btl_tcp_if_" in arg or arg in ("--host", "-H")]
    return not chosen and os.environ.get("SLURM_JOB_NUM_NODES", "1") == "1" and \
        not any(name in os.environ for name in _ELSEWHERE)
