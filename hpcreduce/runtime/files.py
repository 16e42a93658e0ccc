"""Output files written whole, through whatever their path names.

``atomic_file(path)`` writes where ``path`` leads: a symlink this user (or root) owns is
followed to its final target (the link stays a link); one owned by anyone else, anywhere along
the path, is refused (``OutputFileError`` naming it and its owner), never followed nor
replaced: in a shared folder (``/tmp``, a group's checkpoint folder) another user's planted
link would otherwise make us overwrite what it points at (the kernel's
``fs.protected_symlinks`` rule, applied in every folder, which never sees our ``os.replace``
of a target we resolved ourselves); a device or FIFO (``/dev/null``, a named pipe) and
whatever ``/dev/stdout`` leads to (a terminal, a pipe, the file the shell redirected it
to) are written through (appended to); a regular file, or a new path, gets a temporary beside it
that is flushed to disk (fsync), renamed over it (``os.replace`` is atomic) and the
rename made durable (fsync of the folder). A process killed half way leaves the previous
file intact and, at worst, a hidden ``.NAME.HOST.PID.XXXX.partial`` beside it, which
``remove_stale_temporaries`` deletes once its writer (HOST, PID) is gone; an error in the
block removes the temporary at once. ``LineStream`` is a file written line by line as a
run goes (JSON lines), by the same rules. Every failure to write is an ``OutputFileError``
naming the path and the system's reason. Parent folders are created, along the path as
written, never through a symlink: a link whose target's folder is missing is refused, not
followed into folders made for it. ``write_json`` is the common case. ``path_problem`` and
``folder_problem`` say before a run why a file or folder could not be written.
"""
from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import sys
import tempfile
from contextlib import contextmanager
from typing import IO, Any, Iterator, List, Optional, Tuple

from ..errors import OutputFileError
from .given_files import remove_regular

SUFFIX = ".partial"
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[a-z0-9_]+\.partial$")


def foreign_link(path: str) -> Optional[Tuple[str, int]]:
    """The first symlink along ``path`` (every component, as the kernel resolves it) owned by
    neither this user nor root, and its owner's uid; None when there is none. Links under
    /proc (``/dev/stdout``'s) are the kernel's own."""
    trusted, followed = {os.geteuid(), 0}, 0
    done, todo = "/", os.path.abspath(path).split("/")[::-1]
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, part)
        try:
            info = os.lstat(here)
        except OSError:  # absent (or not a folder): nothing further is followed
            return None
        if not stat.S_ISLNK(info.st_mode) or here.startswith("/proc/"):
            done = here
            continue
        if info.st_uid not in trusted:
            return here, info.st_uid
        followed += 1
        if followed > 40:  # the kernel's own limit: the open will say ELOOP
            return None
        target = os.readlink(here)
        done = "/" if target.startswith("/") else done
        todo.extend(target.split("/")[::-1])
    return None


def _foreign_link_problem(path: str) -> Optional[str]:
    """What ``foreign_link`` finds, as words, or None."""
    found = foreign_link(path)
    return f"{found[0]} is a symlink owned by uid {found[1]}, another user: never followed" if found else None


def refuse_foreign_link(path: str) -> None:
    """``OSError`` (``ELOOP``) naming the link ``foreign_link`` finds, if any."""
    problem = _foreign_link_problem(path)
    if problem:
        raise OSError(errno.ELOOP, f"{problem} (remove it, or write elsewhere)")


def _host() -> str:
    """This machine's name as a temporary's name carries it (no dots)."""
    return socket.gethostname().replace(".", "_") or "localhost"


@contextmanager
def as_output_error(path: str) -> Iterator[None]:
    """An OSError in the block becomes an OutputFileError naming ``path`` (and where it leads)."""
    try:
        yield
    except OSError as err:
        target = os.path.realpath(path)
        shown = path if target == os.path.abspath(path) else f"{path} (-> {target})"
        raise OutputFileError(f"cannot write {shown}: {err.strerror or err}") from err


def _resolved(path: str) -> Tuple[str, Optional[int]]:
    """Where ``path``'s symlinks lead (not further than a link into /proc), and this
    process's descriptor it names if it leads to one (``/dev/stdout``, ``/dev/fd/N``)."""
    for _ in range(40):  # the kernel's own limit on links followed
        folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        path = os.path.join(folder, os.path.basename(path))
        if folder == f"/proc/{os.getpid()}/fd" and os.path.basename(path).isdigit():
            return path, int(os.path.basename(path))
        if folder == "/proc" or folder.startswith("/proc/") or not os.path.islink(path):
            break
        path = os.path.join(folder, os.readlink(path))
    return path, None


def written_through(path: str) -> bool:
    """Whether ``path`` is written through rather than replaced: it leads into /proc
    (``/dev/stdout``: a file some process has open, whatever it is) or to something that
    is neither a regular file nor a folder (a device, a FIFO)."""
    target, descriptor = _resolved(path)
    if descriptor is not None or target.startswith("/proc/"):
        return True
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):  # absent, or a path under a regular file
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _make_folders(path: str) -> str:
    """Create the missing folders of ``path`` as written (``makedirs`` never creates a folder
    through a symlink, dangling or not) and return the folder of the file it leads to;
    ``FileNotFoundError`` if ``path`` is a symlink whose target's folder does not exist."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    target = os.path.realpath(path)
    if not os.path.isdir(os.path.dirname(target)):
        raise FileNotFoundError(errno.ENOENT, f"it is a symlink to {target}, whose folder does not exist "
                                "(folders are never created through a link)")
    return os.path.dirname(target)


def _open_through(path: str, mode: str, **options: Any) -> IO:
    """``path`` opened to write through it: this process's descriptor itself when it names
    one (sharing its offset: what the shell redirected stdout to is continued, not
    overwritten), else the device or FIFO, appended to."""
    descriptor = _resolved(path)[1]
    if descriptor is None:
        return open(path, mode.replace("w", "a"), **options)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return open(os.dup(descriptor), mode, **options)


def _text(mode: str) -> dict:
    return {} if "b" in mode else {"encoding": "utf-8"}


@contextmanager
def atomic_file(path: str, mode: str = "w") -> Iterator[IO]:
    """Write ``path`` as the module docstring says; ``mode``: ``"w"`` (UTF-8 text) or ``"wb"``."""
    with as_output_error(path):
        refuse_foreign_link(path)
        target = os.path.realpath(path)
        if written_through(path):
            with _open_through(path, mode, **_text(mode)) as out:
                yield out
            return
        folder = _make_folders(path)
        prefix = f".{os.path.basename(target)}.{_host()}.{os.getpid()}."
        handle, temporary = tempfile.mkstemp(prefix=prefix, suffix=SUFFIX, dir=folder)
        try:
            with os.fdopen(handle, mode, **_text(mode)) as out:
                os.fchmod(out.fileno(), _permissions(target))
                yield out
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        _sync_folder(folder)


def _permissions(target: str) -> int:
    """The mode bits of the file ``target`` replaces, or a new file's (``0o666`` less the umask)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_json(path: str, value: Any, *, indent: int = 1) -> None:
    """``value`` as JSON (a final newline) in ``path``, atomically."""
    with atomic_file(path) as out:
        json.dump(value, out, indent=indent)
        out.write("\n")


class LineStream:
    """A text file written line by line as a run goes: a regular file emptied first when
    ``fresh`` (else appended to), a device or FIFO written through; symlinks followed as
    ``atomic_file`` follows them."""

    def __init__(self, path: str, *, fresh: bool):
        self.path = path
        with as_output_error(path):
            refuse_foreign_link(path)
            through = written_through(path)
            if not through:
                _make_folders(path)
            self._out: Optional[IO[str]] = (_open_through(path, "w", encoding="utf-8", buffering=1) if through else
                                            open(path, "w" if fresh else "a", encoding="utf-8", buffering=1))

    def write_line(self, line: str) -> None:
        """Write ``line`` and a newline (flushed); a failure closes the stream and raises."""
        try:
            with as_output_error(self.path):
                self._out.write(line + "\n")
        except OutputFileError:
            self.abandon()
            raise

    def close(self) -> None:
        if self._out is not None:
            out, self._out = self._out, None
            with as_output_error(self.path):
                out.close()

    def abandon(self) -> None:
        """Close without reporting what could not be flushed (after an error already raised)."""
        try:
            self.close()
        except OutputFileError:
            pass


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


def _alive(host: str, pid: int) -> bool:
    """Whether the writer ``pid`` on ``host`` may still be running (another host's: assumed so)."""
    if host != _host():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        pass
    return True


def remove_stale_temporaries(folder: str) -> List[str]:
    """Delete the temporaries in ``folder`` whose writer (a process on this host) is gone,
    never one a live process may be writing (regular files only); returns their paths."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return remove_regular(os.path.join(folder, name) for name in names for match in [TEMPORARY.match(name)]
                          if match and not _alive(match["host"], int(match["pid"])))


def path_problem(path: str) -> Optional[str]:
    """Why a file could not be written at ``path`` (symlinks followed; its folder is created
    if missing, as ``atomic_file`` would), or None. A device or FIFO is written through, so it
    passes when writable."""
    problem = _foreign_link_problem(path)
    if problem:
        return problem
    if written_through(path):
        return None if os.access(path, os.W_OK) else "not writable"
    try:
        folder = _make_folders(path)
    except OSError as err:  # from makedirs (naming the folder), or a symlink to a missing folder
        return f"cannot create its folder {err.filename}: {err.strerror}" if err.filename else err.strerror
    if os.path.isdir(os.path.realpath(path)) or not os.access(folder, os.W_OK):
        return "not a writable file path"
    return None


def folder_problem(directory: str) -> Optional[str]:
    """Why files could not be written in folder ``directory`` (checked before a run), or None."""
    if os.path.isdir(directory):
        return None if os.access(directory, os.W_OK | os.X_OK) else "is a folder this user cannot write"
    if os.path.lexists(directory):
        return "is a file, not a folder" if os.path.exists(directory) else "is a broken symlink"
    parent = os.path.dirname(os.path.abspath(directory))
    while not os.path.isdir(parent):
        if os.path.lexists(parent):
            return f"cannot be created: {parent} is not a folder"
        parent = os.path.dirname(parent)
    return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be created: {parent} is not writable"
