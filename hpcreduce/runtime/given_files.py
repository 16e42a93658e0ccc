"""Files in folders a user points us at (checkpoint, data, discovery), which may be shared.

Read within bounds: ``open_regular`` opens a regular file only (a FIFO, a device such as
``/dev/zero`` or a folder is refused at once, never waited on or read without end) and one
over ``limit`` bytes is refused before anything is read; ``read_regular`` reads no more than
the file's size it checked, ``read_json`` a JSON file of at most ``MAX_JSON`` bytes.
``npy_header`` reads a ``.npy`` header, whose claim (``nbytes``, multiplied exactly) is compared
with the bytes there are before anything is allocated; ``open_npz`` does so for every array
of an ``.npz``. Named inside: ``inside`` joins a
name read from a file to its folder, refusing one that would lead out of it (absolute,
``..``, a separator). Deleted by our names only: ``remove_regular`` unlinks only regular files
(never a link, a folder or a device), and ``real_folder`` says whether a folder we made is
still one, not a link someone put in its place (whose target is never listed nor emptied).
Problems are ``ValueError``s naming the file; a missing file stays a ``FileNotFoundError``.
"""
from __future__ import annotations

import json
import math
import os
import stat
import zipfile
from contextlib import contextmanager
from typing import BinaryIO, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

MAX_JSON = 64 << 20  # the most bytes of a JSON file we are pointed at (a manifest, a description)
KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
         (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str, limit: Optional[int] = None) -> BinaryIO:
    """``path`` opened to read (binary), once it is a regular file of at most ``limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open does not wait
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in KINDS if test(info.st_mode)), "not a regular file")
            raise ValueError(f"{path} is {kind}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise ValueError(f"{path} is {info.st_size} bytes, more than the {limit} such a file may have")
        os.set_blocking(fd, True)
        return open(path, "rb", opener=lambda _path, _flags: fd)  # named by its path
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: Optional[int] = None) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``), no more than its size when opened."""
    with open_regular(path, limit) as handle:
        return handle.read(os.fstat(handle.fileno()).st_size)


def npy_header(handle: BinaryIO, size: int) -> Tuple[Tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data bytes there are) of the ``.npy`` data at ``handle`` (``size`` bytes
    from its start), left at the first data byte; ``ValueError`` for a Fortran-ordered or object
    array. Compare ``nbytes(shape, dtype)`` with the bytes there before reading them."""
    version = np.lib.format.read_magic(handle)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = reader(handle)
    if fortran or dtype.hasobject:
        raise ValueError("a Fortran-ordered or object array")
    return tuple(shape), dtype, size - handle.tell()


def nbytes(shape: Sequence[int], dtype: np.dtype) -> int:
    """The bytes of an array of ``shape`` and ``dtype``, multiplied exactly (``np.prod`` wraps)."""
    return math.prod(shape) * np.dtype(dtype).itemsize


def npy_file_header(path: str) -> Tuple[Tuple[int, ...], np.dtype, int]:
    """``npy_header`` of the regular file at ``path``."""
    with open_regular(path) as handle:
        return npy_header(handle, os.fstat(handle.fileno()).st_size)


def read_json(path: str, limit: int = MAX_JSON) -> dict:
    """The JSON object in regular file ``path`` of at most ``limit`` bytes (``ValueError`` if not)."""
    value = json.loads(read_regular(path, limit).decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


@contextmanager
def open_npz(path: str) -> Iterator[np.lib.npyio.NpzFile]:
    """The ``.npz`` at ``path`` opened (``np.load``), once it is a regular file whose entries
    are stored (not compressed), add up to no more than the file holds, and hold the bytes
    their array headers claim: reading it allocates no more than the file's size. ``ValueError``
    naming what does not pass."""
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if handle.read(4) != b"PK\x03\x04":
            raise ValueError(f"{path} is not an .npz file (a zip)")
        handle.seek(0)
        with np.load(handle) as stored:
            claimed = 0
            for info in stored.zip.infolist():
                claimed += info.file_size
                if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
                    raise ValueError(f"its entry {info.filename} is compressed (ours never are)")
                if claimed > size:
                    raise ValueError(f"its entries claim {claimed} bytes or more, the file holds {size}")
                if info.filename.endswith(".npy"):
                    with stored.zip.open(info) as entry:
                        shape, dtype, there = npy_header(entry, info.file_size)
                    if nbytes(shape, dtype) > there:
                        raise ValueError(f"its entry {info.filename} claims {dtype} {list(shape)} "
                                         f"({nbytes(shape, dtype)} bytes), {there} data bytes are there")
            yield stored


def inside(folder: str, name: object) -> str:
    """``folder``/``name`` for a ``name`` read from a file; ``ValueError`` if it is not one plain
    file name (so it could lead out of ``folder``)."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name or \
            (os.altsep and os.altsep in name):
        raise ValueError(f"{name!r} is not a file name inside {folder}")
    return os.path.join(folder, name)


def real_folder(path: str) -> bool:
    """Whether ``path`` is a folder itself, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_regular(paths: Iterable[str]) -> List[str]:
    """Unlink those of ``paths`` that are regular files (a link, folder or device is left as it
    is); returns the paths removed."""
    removed = []
    for path in paths:
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
                removed.append(path)
        except FileNotFoundError:
            pass
    return removed
