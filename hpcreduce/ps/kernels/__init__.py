"""Compiled kernels of the rows path (numba ``@njit(nogil=True, cache=True)``), loaded lazily.

``index``: the id index's probes (``find``; ``cells``, which ``IdIndex.remove`` and ``move``
use), ``insert``, a fixed table's row positions and a request's id check, and ``first_touched``
(table-wise rows made on first touch); ``sketch``: the admission sketch's count-min sighting; ``rows``: summing
duplicate ids' gradients (``merge_runs``: several senders' sorted runs at once), the row
optimizers (SGD, momentum, Adagrad, Adam) fused with the gather and scatter (a whole dense
array is updated as one row: ``Optimizer.update``), and a pooled
lookup's backward (``pooled_grad``); ``route``: a worker's shard routing (rendezvous owners, the
group-by, a radix-sort ``unique_inverse``); ``normal``: counter-based normal initial values. Each kernel computes what
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

import numpy as np


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


def warm() -> None:
    """Import numba and load (or compile) the kernels' usual signatures now: a PS role with
    sparse tables calls it while it is set up, so no worker's guarded wait (the watchdog's
    deadline) ever covers a server loading its kernels on its first request. (A dense-only
    server loads the optimizer's kernel at its first update of a piece above
    ``optimizers.CHUNK`` elements: about 0.6 s, once.)"""
    index, normal, rows, route, sketch = (importlib.import_module(f"{__name__}.{name}")
                                          for name in ("index", "normal", "rows", "route", "sketch"))
    ids, cells = np.zeros(1, np.int64), np.full(2, -1, np.int64)
    index.find(np.zeros(2, np.int64), cells, ids)
    index.cells(np.zeros(2, np.int64), cells, ids)
    index.first_touched(np.zeros(2, np.bool_), ids)
    index.first_bad_id(ids, 0, 1, True)
    for small in (np.int32, np.int64):  # a fixed table's index: int32 while its ids fit
        index.direct_positions(np.zeros(1, small), ids)
        index.bucket_positions(np.zeros(2, small), np.zeros(1, small), ids, 1, 6)
    sketch.sighting(np.zeros((1, 2), np.uint16), ids, np.uint64(1), 65535)
    route.owners(ids, np.ones(2, np.uint64))
    route.group(ids, 1)
    route.unique_inverse(ids, 1)
    route.table_keys(ids, ids[:1] + 1, ids[:1] + 1)
    route.split_keys(ids, ids[:1] + 1)
    route.bag_of(ids[:1] + 1)
    normal.counter_normal(np.uint64(1), ids, 1.0, np.zeros(1, np.float32))
    normal.counter_normal_rows(np.uint64(1), ids, 1.0, np.zeros((1, 1), np.float32))
    normal.counter_normal(np.uint64(1), ids.view(np.uint64), 1.0, np.zeros(1, np.float32))
    normal.counter_uniform(np.uint64(1), ids, 0.0, 1.0, np.zeros(1, np.float32))
    for dtype in (np.float32, np.float64):
        values, one = np.zeros((1, 1), dtype), dtype(1)
        rows.gather(values, ids)
        rows.scatter(values, ids, values.copy())
        rows.sum_into(values.copy(), ids, values)
        flat, counts, start = values.reshape(-1), np.ones((1, 1), np.int64), np.zeros(1, np.int64)
        rows.merge_runs(ids[:1], flat, counts, start, start, counts[0], ids[:1].copy(), flat.copy(), start.copy(),
                        ids[:1].copy())
        rows.sgd(values, ids, values.copy(), one)
        rows.pooled_grad(values.copy(), ids[:1], ids[:1], values, flat[:0])
        rows.momentum(values, values.copy(), ids, values.copy(), one, one)
        rows.adagrad(values, values.copy(), ids, values.copy(), one, one)
        rows.adam(values, values.copy(), values.copy(), ids, values.copy(), *[one] * 8)
