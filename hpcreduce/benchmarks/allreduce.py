"""``hpcreduce bench allreduce``: hpcreduce's ring and auto against native MPI_Allreduce.

Per message size (float32): the median time of each candidate, all interleaved call
by call in one run, algbw = bytes / time and busbw = algbw * 2(N-1)/N (the nccl-tests
definition), and busbw relative to the peer.

- ``--device cpu`` (numpy, 4 KiB to 64 MiB by default): ``native`` (MPI_Allreduce, the
  peer), ``ring``, ``rdoubling`` (recursive doubling), ``hierarchical`` (node-local shared
  memory, leaders across nodes), ``one_shot`` (every rank reads every input from the node's
  shared memory; native across nodes), ``auto`` (what users get: input checks on) and ``auto_nocheck`` (the algorithm alone); ``memcpy``, a one-core copy of the same
  bytes timed in the same rounds, is the memory-bandwidth reference: each row's
  ``busbw_vs_memcpy`` (and the table's ``best/memcpy``) is its distance to that limit. The crossovers of ``auto``
  (``collectives/selection.py``) are read from these rows. The fusion case reduces 100 arrays of 10,000 float32 with one
  ``allreduce_many`` against 100 native calls, and once more as views of ``GradientBuckets``
  (``inplace=True``: reduced where they lie, no copies), in a round of its own against the
  native calls (``fusion``).
- ``--device gpu`` (cupy, 4 KiB to 256 MiB): ``ring``, ``auto``, ``native`` (MPI_Allreduce
  on the device arrays where MPI is CUDA-aware, else on pinned host copies) and
  ``nccl`` (the peer, where cupy has NCCL and no two ranks share a GPU); see
  ``benchmarks/gpu.py`` and docs/gpu.md.
- ``--links``: then ping-pongs within a node and between nodes (``node_links``), the two
  links of the cost model (``bench scaling`` fits them).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import numpy as np
from mpi4py import MPI

from ..collectives import allreduce, allreduce_many
from ..collectives.buckets import GradientBuckets
from ..runtime.context import Context
from ..runtime.nodes import rank_nodes
from . import node_links
from .timing import (format_size, fusion, interleaved_medians, iterations_for, launch_facts, size_rows,
                     sizes_argument)

NAME = "allreduce"
HELP = "ring and auto allreduce against native MPI_Allreduce (and NCCL on GPUs), by message size"
DEFAULT_SIZES = {"cpu": "4K,16K,64K,256K,1M,4M,16M,64M", "gpu": "4K,64K,1M,16M,64M,256M"}
CANDIDATES = ("native", "ring", "rdoubling", "hierarchical", "one_shot", "auto", "auto_nocheck")


def run(context: Context, args) -> Dict[str, object]:
    """Every size's rows, the fusion case and, with ``--links``, the two links' ping-pongs."""
    sizes = args.sizes or sizes_argument(DEFAULT_SIZES[args.device])
    if args.device == "gpu":
        from .gpu import run_gpu
        result = {"benchmark": NAME, **run_gpu(context, sizes, args)}
    else:
        result = run_cpu(context, sizes, args)
    if args.links:
        result["links"] = node_links.measure(context.comm, sizes)
    return result


def run_cpu(context: Context, sizes: Sequence[int], args) -> Dict[str, object]:
    comm = context.comm
    rows: List[Dict[str, object]] = []
    for nbytes in sizes:
        x = np.random.default_rng(comm.Get_rank()).random(nbytes // 4, dtype=np.float32)
        candidates = cpu_candidates(context, x)
        medians = interleaved_medians(comm, candidates, warmup=3, iterations=iterations_for(x.nbytes))
        memcpy_GBps = x.nbytes / medians.pop("memcpy") / 1e9
        rows += with_memcpy(size_rows(x.nbytes, medians, comm.Get_size(), peers=("native",)), memcpy_GBps)
    facts = launch_facts(comm)
    title = (f"allreduce, float32, {facts['ranks']} ranks on {facts['cores']} cores"
             f"{' (oversubscribed)' if facts['oversubscribed'] else ''}, transport {facts['transport']}")
    arrays = [np.full(args.fusion_elements, comm.Get_rank(), dtype=np.float32)
              for _ in range(args.fusion_arrays)]
    outs = [np.empty_like(a) for a in arrays]
    views = GradientBuckets(arrays).load(arrays)

    def one_call_each() -> None:
        for a, o in zip(arrays, outs):
            comm.Allreduce(a, o, op=MPI.SUM)

    return {"benchmark": NAME, "device": "cpu", **facts, "title": title,
            "candidates": list(CANDIDATES), "peer": "native", "rows": rows, "nodes": rank_nodes(comm),
            "fusion": fusion(comm, lambda: allreduce_many(arrays, comm=context), one_call_each, arrays,
                             views=lambda: allreduce_many(views, comm=context, inplace=True))}


def cpu_candidates(context: Context, x: np.ndarray) -> Dict[str, Callable[[], object]]:
    """The calls timed at one size: each writes into its own buffer like ``x``."""
    comm = context.comm
    out, copied = np.empty_like(x), np.empty_like(x)
    return {
        "native": lambda: comm.Allreduce(x, out, op=MPI.SUM),
        "ring": lambda: allreduce(x, algorithm="ring", comm=context, out=out, check=False),
        "rdoubling": lambda: allreduce(x, algorithm="recursive_doubling", comm=context, out=out, check=False),
        "hierarchical": lambda: allreduce(x, algorithm="hierarchical", comm=context, out=out, check=False),
        "one_shot": lambda: allreduce(x, algorithm="one_shot", comm=context, out=out, check=False),
        "auto": lambda: allreduce(x, comm=context, out=out, check=True),
        "auto_nocheck": lambda: allreduce(x, comm=context, out=out, check=False),
        "memcpy": lambda: np.copyto(copied, x),
    }


def with_memcpy(rows: List[Dict[str, object]], memcpy_GBps: float) -> List[Dict[str, object]]:
    """``rows`` with their busbw against a one-core memcpy of the same bytes: the distance to
    the memory-bandwidth limit (each element of an allreduce is read and written at least once)."""
    for row in rows:
        row["memcpy_GBps"] = memcpy_GBps
        row["busbw_vs_memcpy"] = row["busbw_GBps"] / memcpy_GBps
    return rows


def render(result: Dict[str, object]) -> str:
    """The console table: busbw in GB/s and, in brackets, relative to the peer."""
    names, peer = result["candidates"], result["peer"]
    by_size: Dict[int, Dict[str, dict]] = {}
    for row in result["rows"]:
        by_size.setdefault(row["bytes"], {})[row["algorithm"]] = row
    memcpy = "memcpy_GBps" in result["rows"][0] if result["rows"] else False
    lines = [result["title"], f"{'size':>9} " + " ".join(f"{name + ' busbw':>22}" for name in names)
             + (f" {'memcpy':>11} {'best/memcpy':>11}" if memcpy else "")]
    for nbytes, rows in by_size.items():
        cells = [f"{rows[name]['busbw_GBps']:9.3f} GB/s ({rows[name]['busbw_vs_' + peer]:4.2f}x)"
                 for name in names]
        if memcpy:
            best = max(row["busbw_vs_memcpy"] for row in rows.values())
            cells += [f"{rows[peer]['memcpy_GBps']:6.2f} GB/s", f"{best:10.2f}x"]
        lines.append(f"{format_size(nbytes):>9} " + " ".join(f"{cell:>22}" for cell in cells[:len(names)])
                     + "".join(f" {cell:>11}" for cell in cells[len(names):]))
    lines += result.get("notes", [])
    f = result["fusion"]
    lines.append(f"fusion: {f['arrays']} x {f['elements']} float32: allreduce_many "
                 f"{f['allreduce_many'] * 1e3:.3f} ms, {f['arrays']} native calls "
                 f"{f['native_per_array'] * 1e3:.3f} ms ({f['speedup']:.1f}x faster)")
    if "views_speedup" in f:
        lines.append(f"fusion over bucket views (GradientBuckets, inplace=True, no copies): allreduce_many "
                     f"{f['allreduce_many_views'] * 1e3:.3f} ms, {f['arrays']} native calls in the same round "
                     f"{f['views_native_per_array'] * 1e3:.3f} ms ({f['views_speedup']:.1f}x faster)")
    if "links" in result:
        lines += node_links.render(result["links"])
    return "\n".join(lines)
