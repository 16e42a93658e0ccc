"""This process's memory, as the operating system counts it.

``peak_rss_bytes``: the most resident memory the process has had (Linux ``VmHWM`` in
``/proc/self/status``; elsewhere ``getrusage``'s ``ru_maxrss``). ``available_bytes``: the
memory the node can still give (psutil when installed, else ``MemAvailable`` in
``/proc/meminfo``; None when neither says).
"""
from __future__ import annotations

import sys
from typing import Optional


def _proc_field(path: str, name: str) -> Optional[int]:
    """The ``name:`` line of a /proc file in bytes (its values are kB), or None."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_bytes() -> int:
    """The peak resident set size of this process so far, in bytes."""
    found = _proc_field("/proc/self/status", "VmHWM")
    if found is not None:
        return found
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS counts bytes, Linux kB


def rss_bytes() -> int:
    """The resident set size of this process now, in bytes (0 when unknown)."""
    return _proc_field("/proc/self/status", "VmRSS") or 0


def available_bytes() -> Optional[int]:
    """Memory this node can still hand out without swapping, in bytes (None when unknown)."""
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        return _proc_field("/proc/meminfo", "MemAvailable")
