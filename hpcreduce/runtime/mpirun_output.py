"""mpirun's own output, passed on as it comes and read for a lost node.

Open MPI 5.0.11's mpirun (PRRTE) exits 0 when the daemon of a node dies: it prints that it lost
the daemon ("PRTE has lost communication with a remote daemon ... on node NODE", on stderr, or
"A daemon failed to report back ... Remote host: NODE", on stdout), ends the job, and reports
success. That text is the only trace, so the launcher runs mpirun with its stdout and stderr
through ``OutputRelay``, which writes every byte on to the launcher's own as it comes (a
pseudo-terminal stands in for a terminal, so ranks still see one) and watches for those
messages (``LostDaemons``).

mpirun must outlive a launcher killed outright: it gets SIGTERM then (``ends_with_parent``) and
ends its ranks, but it first writes a message, and a write to a relay whose reader died fails
(EPIPE), on which mpirun exits at once and leaves its ranks running. So a small process, the
keeper (``keep_draining``), holds the relay's reading ends too; it sleeps while the launcher lives
and, once the launcher died, relays mpirun's output until mpirun closed it.
"""
from __future__ import annotations

import io
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import tty
from typing import IO, Dict, List, Optional, Sequence, Set

from .processes import ends_with_parent

# PRRTE's texts (help-errmgr-base.txt [node-died], plm's failed-daemon report, and the rest).
_NAMED = (re.compile(rb"lost communication with a remote daemon\.\s+HNP daemon\s*:[^\n]*\n\s*"
                     rb"Remote daemon\s*:\s*\S+ on node (\S+)"),
          re.compile(rb"A daemon failed to report back after being spawned\.[\s\S]{0,1500}?Remote host:\s*(\S+)"))
_UNNAMED = re.compile(rb"lost communication with a remote daemon|A daemon failed to report back"
                      rb"|daemon has unexpectedly failed|unable to reliably start one or more daemons")
_OVERLAP = 4096  # a message cut between two reads is found in the next window


class LostDaemons:
    """What one stream of mpirun's output said about lost daemons."""

    def __init__(self) -> None:
        self.nodes: List[str] = []
        self.seen = False
        self._window = b""

    def feed(self, chunk: bytes) -> None:
        window = self._window + chunk
        if _UNNAMED.search(window):
            self.seen = True
            for pattern in _NAMED:
                for match in pattern.finditer(window):
                    node = match.group(1).decode(errors="replace")
                    if node not in self.nodes:
                        self.nodes.append(node)
        self._window = window[-_OVERLAP:]


class OutputRelay:
    """The stdout and stderr to give mpirun (``child_files``), relayed to ``stdout`` and
    ``stderr`` once it started (``start``), until ``finish``. Its keeper process is started at
    once: a process that the launcher must not take for a leftover of the job."""

    def __init__(self, stdout: IO, stderr: IO) -> None:
        self._sinks: Dict[int, int] = {}
        self._ends: List[int] = []
        self._threads: List[threading.Thread] = []
        self.lost = LostDaemons(), LostDaemons()
        for sink, usual in ((stdout, 1), (stderr, 2)):
            if _is_terminal(sink):
                reader, writer = pty.openpty()
                tty.setraw(writer)  # bytes pass as they are: the launcher's own terminal translates
            else:
                reader, writer = os.pipe()
            self._sinks[reader] = _descriptor(sink, usual)
            self._ends.append(writer)
        self._keeper = _start_keeper(list(self._sinks), list(self._sinks.values()))

    def child_files(self) -> Dict[str, int]:
        """``subprocess.Popen`` keywords giving the child the relay's ends."""
        return {"stdout": self._ends[0], "stderr": self._ends[1]}

    def start(self) -> None:
        """Close the child's ends here and start relaying."""
        for end in self._ends:
            os.close(end)
        for (reader, sink), lost in zip(self._sinks.items(), self.lost):
            thread = threading.Thread(target=_relay, args=(reader, sink, lost), daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self, timeout: float = 5.0) -> None:
        """Wait until every process holding the child's ends closed them (at most ``timeout`` s),
        then end the keeper."""
        for thread in self._threads:
            thread.join(timeout)
        if self._keeper is not None:
            self._keeper.kill()
            self._keeper.wait()

    def lost_nodes(self) -> Optional[Set[str]]:
        """The nodes whose daemon mpirun reported lost (empty when it named none), or None when
        it reported no lost daemon."""
        if not any(lost.seen for lost in self.lost):
            return None
        return {node for lost in self.lost for node in lost.nodes}


def _descriptor(stream: IO, usual: int) -> int:
    """The file descriptor under ``stream``; ``usual`` for a stream without one (captured)."""
    try:
        return stream.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return usual


def _is_terminal(stream: IO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # closed
        return False


def _relay(reader: int, sink: int, lost: LostDaemons) -> None:
    """Copy ``reader`` to ``sink`` until every writer closed it; a sink that fails is dropped,
    the reading goes on (mpirun must never block on a full pipe)."""
    try:
        while True:
            try:
                chunk = os.read(reader, 65536)
            except OSError:  # a pseudo-terminal whose last writer closed it
                break
            if not chunk:
                break
            lost.feed(chunk)
            while sink >= 0 and chunk:
                try:
                    chunk = chunk[os.write(sink, chunk):]
                except OSError:
                    sink = -1
    finally:
        os.close(reader)


def _start_keeper(readers: List[int], sinks: List[int]) -> Optional[subprocess.Popen]:
    """The keeper: a child holding ``readers`` (to relay to ``sinks``) that waits for SIGTERM,
    which it gets when this process dies; None where that cannot be armed (off Linux)."""
    arm = ends_with_parent(signal.SIGTERM)
    if arm is None:
        return None

    def block_then_arm() -> None:  # SIGTERM waits, blocked, until keep_draining asks for it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        arm()
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "import sys; from hpcreduce.runtime.mpirun_output import keep_draining; keep_draining(sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, readers)], stdin=subprocess.DEVNULL,
                            stdout=sinks[0], stderr=sinks[1], pass_fds=readers, preexec_fn=block_then_arm,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, (package_parent, os.environ.get("PYTHONPATH"))))})


def keep_draining(readers: Sequence[str]) -> None:
    """The keeper's work: once SIGTERM came (the launcher died), relay ``readers`` to stdout and
    stderr until mpirun closed them."""
    signal.sigwait({signal.SIGTERM})
    threads = [threading.Thread(target=_relay, args=(int(reader), sink, LostDaemons()))
               for reader, sink in zip(readers, (1, 2))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
