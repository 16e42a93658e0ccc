"""Checkpoints for runs without ULFM: written atomically, read back by any number of ranks.

A checkpoint is one ``.npz`` file of named arrays (host or device arrays, stored from
host memory) plus a JSON metadata entry, written atomically (``runtime.files``): a
kill during the write leaves the previous checkpoint intact and never a broken one,
and the temporaries of writers that died are removed by the next save. What the arrays
are is the caller's: the ring stores whole arrays, so a job relaunched with another
number of ranks resumes from them; a PS server stores its shard. The last ``keep``
checkpoints are kept. The metadata carries the ``identity`` of the run that wrote it
(model, shapes, optimizer, seed...: the caller's); ``identity_problem`` says how
another run's differs, so that it is refused rather than restored. A file that does not
read back whole (torn, truncated, corrupted, foreign) is passed over with a warning, and so is one
whose metadata is not a checkpoint's (``metadata_of`` validates every read). Files in a
checkpoint folder may be anyone's: it is read with ``runtime.given_files.open_npz``, which
allocates no more than the file's size; ``read(..., verify=True)`` checks every entry's checksum streaming, holding no array. Pruning
removes only regular files of our names. A step the file name cannot hold (below 0, over
``MAX_STEP``) is refused when written (``OutputFileError``).
"""
from __future__ import annotations

import io
import json
import os
import re
import struct
import sys
import zipfile
import zlib
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..arrays import to_host
from ..errors import OutputFileError
from ..runtime.files import atomic_file, remove_stale_temporaries
from ..runtime.given_files import open_npz, remove_regular

NAME = re.compile(r"^ckpt-(\d{9})\.npz$")
MAX_STEP = 10**9 - 1
"""The largest step a checkpoint's file name (nine digits) holds."""
METADATA_KEY = "__metadata__"
# what a torn, corrupted or foreign file raises when read
UNREADABLE = (OSError, ValueError, KeyError, EOFError, TypeError, struct.error, zipfile.BadZipFile, zlib.error)
Warn = Callable[[str], None]
Arrays = Dict[str, np.ndarray]
CHUNK = 1 << 20  # bytes read at a time when only checksums are checked


def print_warning(text: str) -> None:
    print(f"hpcreduce: warning: {text}", file=sys.stderr, flush=True)


def path_for(directory: str, step: int, suffix: str = ".npz") -> str:
    """Where the checkpoint of ``step`` goes; ``OutputFileError`` for a step the name cannot
    hold (it would never be found again, nor pruned)."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step <= MAX_STEP:
        raise OutputFileError(f"cannot write a checkpoint of step {step!r} into {directory}: a checkpoint's "
                              f"step is an integer from 0 to {MAX_STEP}")
    return os.path.join(directory, f"ckpt-{int(step):09d}{suffix}")


def save(directory: str, step: int, arrays: Mapping[str, object], metadata: Dict[str, object], *,
         keep: int = 2, halfway: Callable[[], None] = lambda: None) -> str:
    """Write the checkpoint of ``step`` atomically (an ``OutputFileError`` if it cannot be);
    ``halfway`` runs in the middle of the write (fault injection kills a rank there)."""
    remove_stale_temporaries(directory)
    buffer = io.BytesIO()
    payload = {name: to_host(value) for name, value in arrays.items()}
    payload[METADATA_KEY] = np.frombuffer(json.dumps({**metadata, "step": step}).encode(), dtype=np.uint8)
    np.savez(buffer, **payload)
    return write_checkpoint(directory, path_for(directory, step), buffer.getbuffer(), keep=keep, halfway=halfway)


def write_checkpoint(directory: str, final: str, data: memoryview, *, keep: int,
                     halfway: Callable[[], None] = lambda: None, name: re.Pattern = NAME) -> str:
    """``data`` written to ``final`` atomically, ``halfway`` run in the middle, then only the
    newest ``keep`` checkpoints named by ``name`` kept (remove dead writers' temporaries first)."""
    with atomic_file(final, "wb") as out:
        out.write(data[:len(data) // 2])
        out.flush()
        halfway()
        out.write(data[len(data) // 2:])
    remove_regular(old_path for _step, old_path in checkpoints(directory, name)[:-keep])
    return final


def checkpoints(directory: str, name: re.Pattern = NAME) -> List[Tuple[int, str]]:
    """(step, path) of the checkpoints in ``directory`` (file names matching ``name``, whose
    first group is the step), oldest first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, entry))
             for entry in os.listdir(directory) for m in [name.match(entry)] if m]
    return sorted(found)


def read(path: str, *, arrays: bool = True, verify: bool = False) -> Tuple[Dict[str, object], Arrays]:
    """(metadata, arrays) of the checkpoint at ``path``, every array read whole (checksums
    checked); with ``arrays`` off only the metadata, every entry's checksum checked too when
    ``verify`` (streaming: no array is held). Raises one of ``UNREADABLE``."""
    with open_npz(path) as stored:
        metadata = metadata_of(stored)
        values = {name: stored[name] for name in stored.files if name != METADATA_KEY} if arrays else {}
        for info in stored.zip.infolist() if verify and not arrays else ():
            with stored.zip.open(info) as entry:  # a wrong checksum raises at the entry's end
                while entry.read(CHUNK):
                    pass
    return metadata, values


def read_or_warn(path: str, warn: Warn, *, arrays: bool = True,
                 verify: bool = False) -> Optional[Tuple[Dict[str, object], Arrays]]:
    """``read(path)``, or None after ``warn`` said why it cannot be used."""
    try:
        return read(path, arrays=arrays, verify=verify)
    except UNREADABLE as err:
        warn(f"checkpoint {path} is unreadable ({type(err).__name__}: {err}); passed over")
        return None


def load_latest(directory: str, warn: Warn = print_warning) -> Optional[Tuple[Dict[str, object], Arrays]]:
    """(metadata, arrays) of the newest checkpoint that reads back whole, or None; each newer
    one that does not is named by ``warn``."""
    for _step, path in reversed(checkpoints(directory)):
        found = read_or_warn(path, warn)
        if found is not None:
            return found
    return None


def metadata_of(stored) -> Dict[str, object]:
    """The metadata entry of a checkpoint opened with ``open_npz``, validated (``checked``)."""
    return checked(json.loads(stored[METADATA_KEY].tobytes().decode()))


def checked(metadata: object) -> Dict[str, object]:
    """``metadata`` when it is a checkpoint's (a dict: ``step`` an integer a name holds,
    ``ranks`` when there a positive integer, ``identity`` when there a dict); ``ValueError``
    saying what is wrong otherwise (the file is then passed over as unreadable)."""
    if not isinstance(metadata, dict):
        raise ValueError(f"its metadata is a {type(metadata).__name__}, not a checkpoint's")
    for key, ok in (("step", lambda v: _integer(v) and 0 <= v <= MAX_STEP), ("ranks", lambda v: _integer(v) and v > 0),
                    ("identity", lambda v: isinstance(v, dict))):
        if (key in metadata or key == "step") and not ok(metadata.get(key)):
            raise ValueError(f"its metadata's {key} is {_shown(metadata.get(key))[:40]}, not a checkpoint's")
    return metadata


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def identity_problem(metadata: Mapping[str, object], identity: Mapping[str, object]) -> Optional[str]:
    """How the run that wrote a checkpoint (its ``metadata``) differs from the run of
    ``identity``, first difference only, or None when it is the same run."""
    mine = json.loads(json.dumps(identity))  # as the checkpoint stores it (lists, string keys)
    theirs = metadata.get("identity")
    if not isinstance(theirs, dict):
        return "was written without a run identity (by another hpcreduce version)"
    for key, value in mine.items():
        if theirs.get(key) != value:
            return f"was written by a run with {key} {_shown(theirs.get(key))}, this run has {key} {_shown(value)}"
    return None


def _shown(value: object) -> str:
    return "(none)" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else str(value)
