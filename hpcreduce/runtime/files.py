"""Files that are whole or absent: results, traces and checkpoints written atomically.

``atomic_file(path)`` opens a temporary file beside ``path``; when the ``with`` block
ends without an error the file is flushed to disk (fsync), renamed over ``path``
(``os.replace`` is atomic) and the rename itself made durable (fsync of the folder).
A process killed half way leaves the previous file intact and, at worst, a hidden
``.NAME.*.partial`` beside it; an error in the block removes the temporary file.
Parent folders are created. ``write_json`` is the common case.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from typing import IO, Any, Iterator, Optional


@contextmanager
def atomic_file(path: str, mode: str = "w") -> Iterator[IO]:
    """Write ``path`` through a temporary file renamed over it at the end (see the module
    docstring); ``mode``: ``"w"`` (UTF-8 text) or ``"wb"``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(handle, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _sync_folder(folder)


def write_json(path: str, value: Any, *, indent: int = 1) -> None:
    """``value`` as JSON (a final newline) in ``path``, atomically."""
    with atomic_file(path) as out:
        json.dump(value, out, indent=indent)
        out.write("\n")


def _sync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable (where the file system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def path_problem(path: str) -> Optional[str]:
    """Why a file could not be written at ``path`` (its folder is created if missing), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        return f"cannot create its folder: {err.strerror}"
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        return "not a writable file path"
    return None
