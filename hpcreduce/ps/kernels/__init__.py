"""Compiled kernels of the rows path (numba ``@njit(nogil=True, cache=True)``), loaded lazily.

``index``: the id index's probe, insert, remove and move; ``sketch``: the admission
sketch's count-min sighting; ``rows``: summing duplicate ids' gradients and the row
optimizers (SGD, momentum, Adagrad, Adam) fused with the gather and scatter; ``route``:
a worker's shard routing (rendezvous owners and the group-by). Each kernel computes what
the numpy code it replaced computed, bit for bit (float32 arithmetic stays float32).

``kernel(module, name)`` gives a function that imports numba and the module on its first
call, so a process that never touches a sparse row never imports numba. Compiled code is
cached next to the modules (``__pycache__``), or, when the package is not writable, in
numba's user-wide cache (or ``NUMBA_CACHE_DIR``); the first call in a fresh environment
compiles (about a second a kernel), later processes load it (milliseconds).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def kernel(module: str, name: str) -> Callable[..., Any]:
    """Kernel ``name`` of submodule ``module``, imported (and compiled or loaded) on first call."""
    compiled = None

    def call(*args):
        nonlocal compiled
        if compiled is None:
            compiled = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        return compiled(*args)
    call.__name__ = name
    return call
