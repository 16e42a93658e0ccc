"""mpirun's own output, passed on as it comes and read for a lost node.

Open MPI 5.0.11's mpirun (PRRTE) exits 0 when the daemon of a node dies: it prints that it lost
the daemon ("PRTE has lost communication with a remote daemon ... on node NODE", on stderr, or
"A daemon failed to report back ... Remote host: NODE", on stdout), ends the job, and reports
success. That text is the only trace, so the launcher runs mpirun with its stdout and stderr
through ``OutputRelay``, which writes every byte on to the launcher's own as it comes (a
pseudo-terminal stands in for a terminal, so ranks still see one) and watches for those
messages (``LostDaemons``).
"""
from __future__ import annotations

import io
import os
import pty
import re
import threading
import tty
from typing import IO, Dict, List, Optional, Set

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
    ``stderr`` once it started (``start``), until ``finish``."""

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
        """Wait until every process holding the child's ends closed them (at most ``timeout`` s)."""
        for thread in self._threads:
            thread.join(timeout)

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
