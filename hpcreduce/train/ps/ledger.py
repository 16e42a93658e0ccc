"""The push ledger of a PS run without ULFM: the acknowledged pushes a relaunch counts as lost.

Each worker of a run with a checkpoint folder D appends every piece the servers acknowledged,
as (step, table, shard key) int64 triples, to ``D/ps-pushes/worker-SLOT.bin``, behind a header
(the checkpoint step its launch resumed from, its slot, 0). A SIGKILLed process loses nothing
it wrote (the bytes are in the kernel's page cache); a crashed node's OS may lose the tail,
which only makes the count low. The next launch reads every ledger before anything else: a
piece is *lost* when the checkpoint it resumes from lacks it: the checkpoint was written before
that launch's resume point (the whole ledger is lost), or its shard's record of the slot's last
push to that table is below the piece's step (``worker_side.lost_pieces``, as in-job recovery
counts). Then the ledgers are removed and each worker starts its own. The folder may be shared: only
regular files named ``worker-SLOT.bin`` are read (no more than their size) and removed, and a
``ps-pushes`` that is a symlink is neither read nor emptied (``runtime.given_files``); a ledger
is never written through a link (``O_NOFOLLOW``).
A ledger that cannot be written (a full disk) is told to ``failed`` as an ``OutputFileError``
naming its file, once, and written no more: the run goes on and ends with that error on every
rank, as a checkpoint that cannot be written does.
Cost: one ``write`` of 24 bytes a piece per push, no fsync.
"""
from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import OutputFileError
from ...ft.checkpoint_files import Warn
from ...runtime.files import as_output_error
from ...runtime.given_files import read_regular, real_folder, remove_regular
from .loop import WorkerLoop
from .worker_side import PushRecord, lost_pieces

FOLDER = "ps-pushes"
NAME = re.compile(r"^worker-\d+\.bin$")
Piece = Tuple[int, int, int]  # (step, table, shard key)


def _folder(directory: str) -> str:
    return os.path.join(directory, FOLDER)


class PushLedger:
    """Worker ``slot``'s ledger in checkpoint folder ``directory`` (its launch resumed from
    checkpoint ``resumed_from``, 0 for none); ``record`` appends acknowledged pieces; a write
    that fails is told to ``failed`` (see the module docstring)."""

    def __init__(self, directory: str, slot: int, resumed_from: int, failed: Callable[[OutputFileError], None]):
        self.path = os.path.join(_folder(directory), f"worker-{slot}.bin")
        self.failed = failed
        self.fd: Optional[int] = None
        with self._failing_once():
            os.makedirs(_folder(directory), exist_ok=True)
            if not real_folder(_folder(directory)):
                raise OSError(errno.ELOOP, "its folder is a symlink (never written through)")
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        self._write([(resumed_from, slot, 0)])

    def record(self, pieces: Sequence[Piece]) -> None:
        if pieces:
            self._write(pieces)

    def _write(self, rows: Sequence[Piece]) -> None:
        if self.fd is None:
            return
        data = np.asarray(rows, dtype=np.int64).tobytes()
        with self._failing_once():
            if os.write(self.fd, data) < len(data):  # what a full disk does before it refuses outright
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    @contextmanager
    def _failing_once(self) -> Iterator[None]:
        """An OSError in the block becomes an ``OutputFileError`` naming the ledger, told to
        ``failed``; the ledger is then closed and written no more."""
        try:
            with as_output_error(self.path):
                yield
        except OutputFileError as err:
            self.failed(err)
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def _ledgers(directory: str) -> List[str]:
    """The paths of the ledgers in ``directory`` (none through a symlinked folder)."""
    folder = _folder(directory)
    return [os.path.join(folder, name) for name in sorted(os.listdir(folder)) if NAME.match(name)] \
        if real_folder(folder) else []


def read_ledgers(directory: str, warn: Warn) -> List[Tuple[int, int, List[Piece]]]:
    """(resumed_from, slot, pieces) of every ledger in ``directory``; an unreadable one is
    named by ``warn`` and passed over (a torn last triple is dropped)."""
    found = []
    for path in _ledgers(directory):
        try:
            data = read_regular(path)
        except (OSError, ValueError) as err:
            warn(f"push ledger {path} is unreadable ({err}); its pushes are not counted")
            continue
        rows = np.frombuffer(data[:len(data) // 24 * 24], dtype=np.int64).reshape(-1, 3)
        if len(rows):
            found.append((int(rows[0, 0]), int(rows[0, 1]), [tuple(int(v) for v in row) for row in rows[1:]]))
    return found


def count_lost(directory: str, step: int, record: PushRecord, warn: Warn) -> int:
    """Acknowledged pieces of the previous launches that checkpoint ``step`` (0: none) lacks;
    ``record``: that checkpoint's record of pushes."""
    lost = 0
    for resumed_from, slot, pieces in read_ledgers(directory, warn):
        if step <= resumed_from:  # written before that launch started: it has none of its pushes
            lost += len(pieces)
        else:
            lost += len(lost_pieces(pieces, slot, record))
    return lost


def remove_ledgers(directory: str) -> None:
    """Remove the ledgers in ``directory`` (regular files of our names only)."""
    remove_regular(_ledgers(directory))


class LedgeredLoop(WorkerLoop):
    """A worker loop that appends each acknowledged piece to its push ledger."""

    ledger: PushLedger

    duplicates_until = 0  # steps below it were pushed before the relaunch: DUPLICATE pieces are not made again

    def push(self) -> None:
        self.taking_over = self.step < self.duplicates_until
        super().push()

    def acknowledged(self, pieces) -> None:
        step = self.outgoing.step
        super().acknowledged(pieces)
        self.ledger.record([(step, table, key) for table, key in pieces])
