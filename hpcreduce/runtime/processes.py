"""The processes a job leaves behind, found and ended (Linux ``/proc``; elsewhere none are found).

mpirun's ranks do not stay in its process group: Open MPI puts each local rank in a group of
its own, and a daemon (``prted``) of another "node" starts a session of its own. A rank that
outlives mpirun (a ULFM job where one rank failed at once, a lost daemon's ranks) is then
reparented to init and runs on. The launcher therefore makes itself the "child subreaper" of
what it starts (``adopting_orphans``): every orphan of the job becomes its child, and
``end_orphans`` ends those once mpirun is gone. ``end_session`` ends what is left of a job
started in a session of its own.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _prctl():
    """libc's ``prctl``, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def adopting_orphans() -> Iterator[bool]:
    """Within it, orphaned descendants of this process become its children instead of init's
    (yields whether that holds: Linux only). The previous setting is restored on leaving."""
    prctl = _prctl()
    if prctl is None:
        yield False
        return
    previous = ctypes.c_int(0)
    prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0)
    adopted = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield adopted
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, previous.value, 0, 0, 0)


def ends_with_parent(sig: int = signal.SIGTERM) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process dies,
    however it dies (SIGKILL too); None off Linux. mpirun ends its ranks on SIGTERM."""
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), sig)
    return arm


def pids() -> List[int]:
    """Every running process's pid (none where there is no ``/proc``)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()] if os.path.isdir("/proc") else []


def command_line(pid: int) -> str:
    """``pid``'s command line, its words joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes_naming(text: str) -> List[int]:
    """The processes other than this one whose command line contains ``text``."""
    me = os.getpid()
    return [pid for pid in pids() if pid != me and text in command_line(pid)]


def _table() -> Dict[int, Tuple[int, int]]:
    """Every process's (parent, session), by pid."""
    table = {}
    for pid in pids():
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        table[pid] = (int(fields[1]), int(fields[3]))
    return table


def children() -> Set[int]:
    """The pids of this process's children."""
    me = os.getpid()
    return {pid for pid, (parent, _) in _table().items() if parent == me}


def describe(pid: int) -> str:
    """``pid`` and its command line, shortened."""
    return f"{pid} ({command_line(pid)[:80] or '?'})"


def _kill_trees(roots: Set[int], table: Dict[int, Tuple[int, int]]) -> List[int]:
    """SIGKILL ``roots`` and all their descendants, parents first; the pids that were alive."""
    below: Dict[int, List[int]] = {}
    for pid, (parent, _) in table.items():
        below.setdefault(parent, []).append(pid)
    killed, todo = [], sorted(roots)
    while todo:
        pid = todo.pop(0)
        todo += below.get(pid, [])
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed


def end_orphans(known: Set[int], wait_s: float = 5.0) -> List[str]:
    """SIGKILL (and reap) every child of this process not in ``known`` and what runs below it:
    the job's processes adopted by ``adopting_orphans`` after mpirun ended. Returns those that
    were still running, described; zombies are only reaped."""
    me, killed, described = os.getpid(), set(), []
    deadline = time.monotonic() + wait_s
    while True:
        table = _table()
        adopted = {pid for pid, (parent, _) in table.items() if parent == me and pid not in known}
        running = {pid for pid in adopted - killed if not _zombie(pid)}
        described += [describe(pid) for pid in sorted(running)]
        killed.update(_kill_trees(running, table))
        for pid in adopted:  # the killed ones once they are gone, descendants adopted meanwhile next round
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not adopted or time.monotonic() > deadline:
            return described
        time.sleep(0.02)


def end_session(session: int) -> List[int]:
    """SIGKILL every process of session ``session`` (a job started with ``start_new_session``)."""
    table = _table()
    return _kill_trees({pid for pid, (_, sid) in table.items() if sid == session and pid != os.getpid()}, table)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True
