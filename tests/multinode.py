"""Several "nodes" on this host for real multi-node mpirun jobs (see
``shared/reference/multi-node-on-one-host.md``): mpirun's ssh agent starts each node's daemon
in its own UTS namespace with that node's hostname, so ranks see per-node hostnames,
``COMM_TYPE_SHARED`` splits by node and traffic between nodes goes over TCP.
Needs root and ``unshare``; ``nodes`` skips the test, saying why, elsewhere."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from hpcreduce.runtime.processes import describe, processes_naming as running_naming

AGENT = """#!/bin/bash
# mpirun's ssh agent for "nodes" on this host: the daemon gets its own UTS namespace and hostname.
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
exec unshare --uts bash -c "hostname $host; $*"
"""


@dataclass
class Nodes:
    """A hostfile of nodes ``node1``.. and the environment that makes mpirun start them here."""

    hostfile: str
    env: Dict[str, str]
    names: Sequence[str]


def nodes(directory: Path, slots: Sequence[int]) -> Nodes:
    """Nodes ``node1``.. with ``slots[i]`` slots each, set up in ``directory`` (skips without root)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("several nodes on one host need root and unshare (UTS namespaces)")
    agent, hosts = directory / "agent.sh", directory / "hosts"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    names = [f"node{i + 1}" for i in range(len(slots))]
    hosts.write_text("".join(f"{names[i]} slots={count}\n" for i, count in enumerate(slots)))
    # added to the environment; more ranks than cores: ranks yield while they wait
    env = {"PRTE_MCA_plm_ssh_agent": str(agent), "OMPI_MCA_mpi_yield_when_idle": "1"}
    return Nodes(str(hosts), env, names)


def daemon_of(node: str) -> Optional[int]:
    """The pid of the Open MPI daemon (``prted``) that runs ranks on ``node``, None while there is none."""
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        if _comm(pid) != "prted":
            continue
        host = subprocess.run(["nsenter", "-t", str(pid), "-u", "hostname"], capture_output=True, text=True)
        if host.stdout.strip() == node and _runs_ranks(pid):
            return pid
    return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def _runs_ranks(pid: int) -> bool:
    """Whether daemon ``pid`` has children other than daemons (the agent's prted has the real one)."""
    for name in (name for name in os.listdir("/proc") if name.isdigit()):
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        if parent == pid and _comm(int(name)) not in ("prted", ""):
            return True
    return False


def processes_naming(text: str) -> List[str]:
    """The running processes whose command line contains ``text`` (a test's own folder, say), described."""
    return [describe(pid) for pid in running_naming(text)]
