"""Checkpoints for runs without ULFM: written atomically, read back by any number of ranks.

A checkpoint is one ``.npz`` file of named arrays (host or device arrays, stored from
host memory) plus a JSON metadata entry, written atomically (``runtime.files``): a
kill during the write leaves the previous checkpoint intact and never a broken one.
What the arrays are is the caller's: the ring stores whole arrays, so a job relaunched
with another number of ranks resumes from them; a PS server stores its shard. The
last ``keep`` checkpoints are kept.
"""
from __future__ import annotations

import io
import json
import os
import re
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..arrays import to_host
from ..runtime.files import atomic_file

NAME = re.compile(r"^ckpt-(\d{9})\.npz$")
METADATA_KEY = "__metadata__"
UNREADABLE = (OSError, ValueError, KeyError, EOFError)  # what a torn or foreign file raises


def path_for(directory: str, step: int) -> str:
    return os.path.join(directory, f"ckpt-{step:09d}.npz")


def save(directory: str, step: int, arrays: Dict[str, np.ndarray], metadata: Dict[str, object], *,
         keep: int = 2, halfway: Callable[[], None] = lambda: None) -> str:
    """Write the checkpoint of ``step`` atomically; ``halfway`` runs in the middle of the write
    (fault injection kills a rank there)."""
    buffer = io.BytesIO()
    payload = {name: to_host(value) for name, value in arrays.items()}
    payload[METADATA_KEY] = np.frombuffer(json.dumps({**metadata, "step": step}).encode(), dtype=np.uint8)
    np.savez(buffer, **payload)
    data = buffer.getbuffer()
    final = path_for(directory, step)
    with atomic_file(final, "wb") as out:
        out.write(data[:len(data) // 2])
        out.flush()
        halfway()
        out.write(data[len(data) // 2:])
    for _step, old_path in checkpoints(directory)[:-keep]:
        os.unlink(old_path)
    return final


def checkpoints(directory: str) -> List[Tuple[int, str]]:
    """(step, path) of the complete checkpoints in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, name))
             for name in os.listdir(directory) for m in [NAME.match(name)] if m]
    return sorted(found)


def load_latest(directory: str) -> Optional[Tuple[Dict[str, object], Dict[str, np.ndarray]]]:
    """(metadata, arrays) of the newest checkpoint that reads back whole, or None."""
    for _step, path in reversed(checkpoints(directory)):
        try:
            with np.load(path) as stored:
                arrays = {name: stored[name] for name in stored.files if name != METADATA_KEY}
                metadata = metadata_of(stored)
            return metadata, arrays
        except UNREADABLE:
            continue
    return None


def metadata_of(stored) -> Dict[str, object]:
    """The metadata entry of a checkpoint opened with ``np.load``."""
    return json.loads(stored[METADATA_KEY].tobytes().decode())
