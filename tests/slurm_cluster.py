"""A real two-node Slurm on this one host that the test suite starts for itself.

``slurm_cluster`` (a session-scoped pytest fixture; import it into a test module)
installs Debian's Slurm and munge when they are missing (as root, with apt), starts
a private ``munged``, ``slurmctld`` and one ``slurmd`` per node on free loopback ports
with every file under one run folder, waits until both nodes are idle and yields a
:class:`SlurmCluster`. Each slurmd runs in its own UTS namespace (``unshare --uts``)
named ``node1`` or ``node2``, so the tasks it starts see that hostname: ``srun -N 2``
and ``mpirun`` in a two-node allocation put ranks on two "nodes" for real (separate
daemons, separate PMIx servers, TCP between them; shared memory only within a node). At the end it stops the daemons by the PIDs in their PID
files. Run folders left by an earlier test session that died are cleaned up first:
only daemons whose command line names that folder are stopped.

Skips (with the reason) only where Slurm cannot be installed: not root, no apt,
or the install fails. A cluster that is installed but does not start fails the tests.
"""
from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "libpmix-dev")
PROGRAMS = ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scancel", "munged")
RUNS_BASE = Path(tempfile.gettempdir()) / "hpcreduce-slurm"
MUNGE_KEY = Path("/etc/munge/munge.key")
NODES = ("node1", "node2")
CPUS = 4  # per node: 4 ranks of one node, 8 over both, fit on 2 cores (ranks yield)
START_TIMEOUT = 30.0

# Exported by a TaskProlog into every task: waiting ranks yield their core (8 slots
# on 2 cores), and mpirun inside a job does not try to bind 8 ranks to 2 cores.
TASK_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1", "PRTE_MCA_hwloc_default_binding_policy": "none"}


def missing_pieces() -> List[str]:
    """Programs and libraries the cluster needs that are not installed."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if not glob.glob("/usr/lib/*/libpmix.so"):
        missing.append("libpmix.so")  # Slurm's mpi/pmix plugin loads the unversioned name
    if not MUNGE_KEY.exists():
        missing.append(str(MUNGE_KEY))
    return missing


def install_slurm() -> Optional[str]:
    """Install what is missing; return why Slurm cannot be had here, or None when it is ready."""
    missing = missing_pieces()
    if not missing:
        return None
    if os.geteuid() != 0:
        return f"Slurm is not installed ({', '.join(missing)} missing) and we are not root"
    if shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(missing)} missing) and there is no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    log = []
    for attempt in ("install", "update", "install"):
        argv = install if attempt == "install" else ["apt-get", "update", "-q"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        log.append(f"$ {' '.join(argv)} (exit {done.returncode})\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
        if attempt == "install" and done.returncode == 0 and not missing_pieces():
            return None
    return "installing Slurm with apt failed:\n" + "\n".join(log)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_by_pid_file(pid_file: Path, must_mention: str, wait: float = 10.0) -> None:
    """Stop the daemon named in ``pid_file`` if its command line contains ``must_mention``
    (so a reused PID is never hit): SIGTERM, then SIGKILL after ``wait`` seconds."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if must_mention not in _cmdline(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid) and must_mention in _cmdline(pid):
        os.kill(pid, signal.SIGKILL)


def runs_base_problem(base: Path = RUNS_BASE) -> Optional[str]:
    """Why ``base`` (in the world-writable temporary folder) cannot hold the run folders, after
    creating it if missing; None when it is a real folder of this user that no one else may
    write. Anyone who owns it could swap a run folder for one of theirs, and root's daemons
    would run what its slurm.conf names (munged, run as the munge user, must traverse it: 0755)."""
    try:
        base.mkdir(mode=0o755)
    except FileExistsError:
        pass
    except OSError as err:
        return f"cannot create {base}: {err}"
    found = os.lstat(base)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        return (f"{base} is not a folder of this user that only it may write (owner uid {found.st_uid}, "
                f"mode {stat.filemode(found.st_mode)}): remove it, or set TMPDIR to a private folder")
    return None


def reap_leftovers(base: Path = RUNS_BASE) -> None:
    """Stop the daemons of run folders whose test session is gone, and remove the folders."""
    for run in sorted(base.glob("run-*")):
        try:
            owner = int((run / "owner").read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and _pid_alive(owner) and owner != os.getpid():
            continue  # another test session is using it
        for pid_file in sorted(run.glob("*/*.pid")):
            stop_by_pid_file(pid_file, str(run))
        shutil.rmtree(run, ignore_errors=True)


def slurm_conf(run: Path, host: str, ctld_port: int, slurmd_ports: Sequence[int]) -> str:
    """slurm.conf for ``NODES`` with ``CPUS`` CPUs each, PMIx as the default MPI, no accounting.
    Per-node paths (``%n``): spool, PID file, log and TmpFS, where Slurm's PMIx plugin makes
    each step's folders (one shared folder makes the two nodes collide)."""
    nodes = "".join(f"NodeName={node} NodeAddr=127.0.0.1 Port={port} CPUs={CPUS} Sockets=1 "
                    f"CoresPerSocket={CPUS} ThreadsPerCore=1 State=UNKNOWN\n"
                    for node, port in zip(NODES, slurmd_ports))
    return f"""\
ClusterName=hpcreduce-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={run}/munge/munge.socket
StateSaveLocation={run}/state
SlurmdSpoolDir={run}/spool/%n
SlurmctldPidFile={run}/run/slurmctld.pid
SlurmdPidFile={run}/run/slurmd.%n.pid
SlurmctldLogFile={run}/log/slurmctld.log
SlurmdLogFile={run}/log/slurmd.%n.log
TmpFS={run}/tmp/%n
FirstJobId={random.randint(1000, 900000)}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog={run}/task_prolog.sh
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=5
KillWait=5
ReturnToService=2
{nodes}PartitionName=test Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """A private two-node Slurm: its run folder, the environment clients need, its daemons."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.conf = run / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]
        self.nodes = NODES
        self.env: Dict[str, str] = {"SLURM_CONF": str(self.conf)}
        self.daemons: Dict[str, subprocess.Popen] = {}
        self.startup_seconds = 0.0

    # -- start and stop -------------------------------------------------------
    def start(self) -> None:
        began = time.monotonic()
        for sub in ("state", "run", "log", "munge", "out", *(f"{d}/{n}" for d in ("spool", "tmp") for n in NODES)):
            (self.run / sub).mkdir(parents=True, exist_ok=True)
        (self.run / "owner").write_text(str(os.getpid()))
        self.run.chmod(0o755)  # munged runs as the munge user and must reach its folder
        shutil.chown(self.run / "munge", "munge", "munge")
        (self.run / "munge").chmod(0o700)
        self.conf.write_text(slurm_conf(self.run, self.host, free_port(), [free_port() for _ in NODES]))
        prolog = self.run / "task_prolog.sh"
        prolog.write_text("#!/bin/sh\n" + "".join(f"echo export {k}={v}\n" for k, v in TASK_ENV.items()))
        prolog.chmod(0o755)
        munge = self.run / "munge"
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={munge}/munge.socket",
                               f"--pid-file={munge}/munged.pid", f"--key-file={MUNGE_KEY}",
                               f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"],
                    user="munge")
        self._wait_for(lambda: (munge / "munge.socket").exists(), "munged to open its socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        for node in NODES:  # its own hostname; exec keeps the PID, so it is stopped by it
            self._spawn(f"slurmd.{node}", ["unshare", "--uts", "sh", "-c", f'hostname {node} && exec '
                                           f'slurmd -D -N {node} -f "{self.conf}"'],
                        env={"PMIX_MCA_psec": "native"})
        self._wait_for(self._nodes_idle, "both nodes to be idle in sinfo")
        self.startup_seconds = time.monotonic() - began

    def _spawn(self, name: str, argv: List[str], user: Optional[str] = None,
               env: Optional[Dict[str, str]] = None) -> None:
        log = open(self.run / "log" / f"{name}.out", "w")  # noqa: SIM115 (closed with the process)
        self.daemons[name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **self.env, **(env or {})}, start_new_session=True, user=user,
            group=user, extra_groups=[] if user else None)
        log.close()

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            dead = [name for name, proc in self.daemons.items() if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}\n{self.logs()}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {START_TIMEOUT} s waiting for {what}\n{self.logs()}")

    def _nodes_idle(self) -> bool:
        done = self.command(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10, check=False)
        return sorted(done.stdout.split()) == sorted([*NODES, *["idle"] * len(NODES)])

    def daemon_pids(self) -> Dict[str, int]:
        """The daemons of this cluster that are still running: {name: PID}."""
        return {name: proc.pid for name, proc in self.daemons.items() if _pid_alive(proc.pid)}

    def kill_node(self, node: str, must_mention: str) -> List[int]:
        """SIGKILL, in one sweep, every process running on ``node`` (in its slurmd's UTS
        namespace: what that node runs) whose command line contains ``must_mention``: a lost
        node, as far as those processes go. Returns their PIDs."""
        home = os.readlink(f"/proc/{self.daemons[f'slurmd.{node}'].pid}/ns/uts")
        victims = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if os.readlink(entry / "ns" / "uts") == home and must_mention in _cmdline(int(entry.name)):
                    victims.append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        return victims

    def stop(self) -> None:
        """Stop the slurmds, slurmctld and munged by the PIDs in their PID files, then remove the folder."""
        for name, folder in (*((f"slurmd.{n}", "run") for n in NODES), ("slurmctld", "run"), ("munged", "munge")):
            stop_by_pid_file(self.run / folder / f"{name}.pid", str(self.run))
            proc = self.daemons.get(name)
            if proc is None:
                continue
            if proc.poll() is None:  # it failed before writing its PID file: its own PID then
                proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.run, ignore_errors=True)
        left = self.daemon_pids()
        if left:
            raise AssertionError(f"Slurm daemons still running after stop: {left}")

    def logs(self, tail: int = 3000) -> str:
        """The end of every daemon log, for failure messages."""
        parts = []
        for path in sorted((self.run / "log").glob("*")) + [self.run / "munge" / "munged.log"]:
            if path.exists() and path.stat().st_size:
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    # -- clients ----------------------------------------------------------------
    def job_env(self, env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """The environment a job is submitted with: ours, this Python first on PATH, then ``env``."""
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        return {**os.environ, "PATH": path, **self.env, **(env or {})}

    def command(self, argv: Sequence[str], *, timeout: float = 30, check: bool = True,
                env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster."""
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=self.job_env(env), stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise AssertionError(f"$ {' '.join(argv)} (exit {done.returncode})\n{done.stdout}{done.stderr}")
        return done

    def sbatch_wait(self, script_path, env: Optional[Dict[str, str]] = None, timeout: float = 180,
                    args: Sequence[str] = ()) -> Tuple[int, str]:
        """Submit ``script_path`` with ``sbatch --wait`` and return (the job's exit code, its output).

        ``env`` is added to the job's environment; ``args`` go to sbatch before the script.
        Past ``timeout`` seconds the job is cancelled and the test fails with what it printed.
        """
        output = self.run / "out" / f"{Path(script_path).stem}-{uuid.uuid4().hex[:8]}.out"
        argv = ["sbatch", "--wait", "--parsable", f"--output={output}", *args, str(script_path)]
        sbatch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=self.job_env(env), stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            stdout, stderr = sbatch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            sbatch.kill()
            stdout, stderr = sbatch.communicate()
            job_id = stdout.strip().split(";")[0]
            if job_id:
                self.command(["scancel", job_id], check=False)
            text = output.read_text(errors="replace") if output.exists() else ""
            raise AssertionError(f"job {job_id or '?'} ({script_path}) did not end within {timeout} s "
                                 f"and was cancelled (a hang is a bug)\n{text}\n{stderr}")
        text = output.read_text(errors="replace") if output.exists() else ""
        if sbatch.returncode != 0 and stderr.strip():
            text += f"\n[sbatch] {stderr.strip()}"
        return sbatch.returncode, text


_shared: Dict[str, object] = {"cluster": None, "users": 0, "skip": None, "error": None}


def _start_once() -> None:
    """Install and start the cluster for this session; remember why not, so it is tried once."""
    began = time.monotonic()
    reason = install_slurm()
    if reason is not None:
        _shared["skip"] = reason
        return
    unsafe = runs_base_problem()
    if unsafe is not None:
        _shared["error"] = unsafe
        return
    reap_leftovers()
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="run-", dir=RUNS_BASE)))
    try:
        cluster.start()
    except Exception as err:  # any failure to start is reported with the daemons' logs
        _shared["error"] = f"the test Slurm did not start: {err}"
        cluster.stop()
        return
    cluster.startup_seconds = time.monotonic() - began
    print(f"\n[slurm] two-node cluster up in {cluster.startup_seconds:.1f} s (including any install): "
          f"SLURM_CONF={cluster.conf}", file=sys.stderr)
    _shared["cluster"] = cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """One private Slurm for the whole test session (shared by every module that imports this)."""
    if _shared["cluster"] is None and _shared["skip"] is None and _shared["error"] is None:
        _start_once()
    if _shared["skip"] is not None:
        pytest.skip(str(_shared["skip"]))
    if _shared["error"] is not None:
        pytest.fail(str(_shared["error"]), pytrace=False)
    _shared["users"] += 1
    try:
        yield _shared["cluster"]
    finally:
        _shared["users"] -= 1
        if _shared["users"] == 0 and _shared["cluster"] is not None:
            _shared["cluster"].stop()
            _shared["cluster"] = None
