"""Several "nodes" on this host for real multi-node mpirun jobs (see
``shared/reference/multi-node-on-one-host.md``): mpirun's ssh agent starts each node's daemon
in its own UTS namespace with that node's hostname, so ranks see per-node hostnames,
``COMM_TYPE_SHARED`` splits by node and traffic between nodes goes over TCP.
Needs root and ``unshare``; ``nodes`` skips the test, saying why, elsewhere."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Sequence

import pytest

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
