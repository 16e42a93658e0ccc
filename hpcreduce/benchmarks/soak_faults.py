"""Faults ``hpcreduce bench soak`` delivers from outside a run, as an operator or the machine would.

- ``stop``: SIGSTOP of a rank (a hung, not dead, peer: MPI reports nothing; the run's
  ``--deadline`` must end it with a clear error, or the run recovers);
- ``daemon``: SIGKILL of the Open MPI daemon (``prted``) of the launch's second node, in a
  two-node launch on this host (``two_nodes``: mpirun's ssh agent starts each node's daemon in
  its own UTS namespace, ``shared/reference/multi-node-on-one-host.md``);
- ``spawn``: SIGKILL of a rank while the job spawns ranks (``--grow``, ``--replace``): at the
  first spawned rank seen.

A ``Striker`` thread watches the run (its ``--metrics`` lines: committed steps; its processes:
those whose command line names the run's JSON path) and fires once the run has committed
``step`` steps, appending the moment to the run's kill log as the ranks' own kills do
(``ft.inject.record``'s format). Ranks are told apart by their ``PMIX_NAMESPACE``: the
launch's ranks are job 1 (``...@1``), spawned ones later jobs.
"""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from ..runtime.processes import processes_naming

POLL_S = 0.02
AGENT = """#!/bin/bash
# mpirun's ssh agent for "nodes" on this host: the daemon gets its own UTS namespace and hostname.
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
exec unshare --uts bash -c "hostname $host; $*"
"""


@dataclass(frozen=True)
class External:
    """A fault from outside: ``kind`` (stop, daemon, spawn) on ``target`` (a launch rank; for
    daemon, the node number from 1) once ``step`` steps are committed."""

    kind: str
    target: int
    step: int

    def describe(self) -> str:
        what = {"stop": f"SIGSTOP rank {self.target}", "daemon": f"SIGKILL node{self.target}'s prted",
                "spawn": f"SIGKILL rank {self.target} while spawning"}[self.kind]
        return f"{what} after step {self.step}"


@dataclass
class Nodes:
    """A hostfile of two nodes on this host and the environment that makes mpirun start them."""

    hostfile: str
    env: Dict[str, str]


def two_nodes(folder: Path, ranks: int) -> Tuple[Optional[Nodes], str]:
    """Nodes node1 and node2 (half the ranks each, node1 the larger half) set up in ``folder``;
    (None, why not) without root or ``unshare``."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None, "two nodes on one host need root and unshare (UTS namespaces)"
    folder.mkdir(parents=True, exist_ok=True)
    agent, hosts = folder / "agent.sh", folder / f"hosts-{ranks}"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    hosts.write_text(f"node1 slots={ranks - ranks // 2}\nnode2 slots={ranks // 2}\n")
    # more slots than cores: ranks yield while they wait, and are not bound to cores they would share
    env = {"PRTE_MCA_plm_ssh_agent": str(agent), "OMPI_MCA_mpi_yield_when_idle": "1",
           "PRTE_MCA_hwloc_default_binding_policy": "none"}
    return Nodes(str(hosts), env), ""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def rank_identity(pid: int) -> Optional[Tuple[str, int]]:
    """(PMIx namespace, rank) of an MPI process, from its environment; None for another process."""
    env = dict(item.split(b"=", 1) for item in _read(f"/proc/{pid}/environ").split(b"\0") if b"=" in item)
    if b"PMIX_NAMESPACE" not in env or b"PMIX_RANK" not in env:
        return None
    return env[b"PMIX_NAMESPACE"].decode(), int(env[b"PMIX_RANK"])


class Striker(threading.Thread):
    """Delivers ``fault`` to the run whose command lines name ``marker``; ``fired`` tells what it
    did (None: the run ended first). ``stop()`` ends the watch."""

    def __init__(self, fault: External, marker: str, metrics: str, kill_log: str):
        super().__init__(daemon=True)
        self.fault, self.marker, self.metrics, self.kill_log = fault, marker, metrics, kill_log
        self.done = threading.Event()
        self.fired: Optional[str] = None
        self.launchers: Set[str] = set()  # the namespaces of its mpirun's daemons (-PID@0), seen when it fires

    def stop(self) -> None:
        self.done.set()
        self.join()

    def run(self) -> None:
        while not self.done.is_set() and self._steps() < self.fault.step:
            time.sleep(POLL_S)
        if self.done.is_set():
            return
        self.launchers = self._launchers()
        kind = self.fault.kind
        launch = {rank: pid for pid, (space, rank) in self._ranks().items() if space.endswith("@1")}
        if kind == "spawn":
            while not self.done.is_set() and not any(not space.endswith("@1") for space, _ in self._ranks().values()):
                time.sleep(POLL_S)
            if self.done.is_set():
                return
        pids = self._daemons() if kind == "daemon" else [launch[self.fault.target]] if self.fault.target in launch \
            else []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
            except ProcessLookupError:
                continue
        if pids:
            self.fired = self.fault.describe()
            with open(self.kill_log, "a", encoding="utf-8") as log:
                log.write(f"{time.time():.6f} {pids[0]} soak: {self.fired}\n")

    def _steps(self) -> int:
        return _read(self.metrics).count(b"\n")

    def _ranks(self) -> Dict[int, Tuple[str, int]]:
        found = {pid: rank_identity(pid) for pid in processes_naming(self.marker)}
        return {pid: identity for pid, identity in found.items() if identity is not None}

    def _launchers(self) -> Set[str]:
        return {f"-{pid}@0" for pid in processes_naming(self.marker)
                if os.path.basename(_args(pid)[0]) in ("mpirun", "prterun")}

    def _daemons(self) -> List[int]:
        """The prted processes of node ``target`` (its daemon's vpid) of this run's mpirun."""
        return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                if _daemon_of(_args(pid), self.launchers, self.fault.target)]

    def daemons_left(self) -> List[int]:
        """The daemons (any node) of the run's mpirun still up (after the run: left behind)."""
        return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                if _daemon_of(_args(pid), self.launchers, None)]


def _args(pid: int) -> List[str]:
    """A process's command line, split ("" alone when it is gone)."""
    return _read(f"/proc/{pid}/cmdline").decode(errors="replace").split("\0")


def _daemon_of(args: List[str], launchers: Set[str], vpid: Optional[int]) -> bool:
    """Whether ``args`` is a prted of one of ``launchers`` (``-PID@0`` ends its namespace) with
    ``vpid`` (None: any)."""
    def after(key: str) -> str:
        return args[args.index(key) + 1] if key in args[:-1] else ""
    return (os.path.basename(args[0]) == "prted" and (vpid is None or after("ess_base_vpid") == str(vpid))
            and any(after("ess_base_nspace").endswith(end) for end in launchers))
