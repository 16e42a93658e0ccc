"""``hpcreduce bench allreduce``: hpcreduce's ring and auto against native MPI_Allreduce.

Per message size (float32, 4 KiB to 64 MiB by default): the median time of each
candidate, all interleaved call by call in one run, algbw = bytes / time and
busbw = algbw * 2(N-1)/N (the nccl-tests definition), and busbw relative to native.
Candidates: ``native`` (MPI_Allreduce), ``ring``, ``auto`` (what users get: input
checks on) and ``auto_nocheck`` (the algorithm alone). The fusion case reduces 100
arrays of 10,000 float32 with one ``allreduce_many`` against 100 native calls.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
from mpi4py import MPI

from ..collectives import allreduce, allreduce_many
from ..runtime.context import Context
from .timing import format_size, interleaved_medians, iterations_for, launch_facts, sizes_argument

NAME = "allreduce"
HELP = "ring and auto allreduce against native MPI_Allreduce, by message size"
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
CANDIDATES = ("native", "ring", "auto", "auto_nocheck")


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", type=sizes_argument, default=sizes_argument(DEFAULT_SIZES),
                        help=f"message sizes in bytes, comma-separated (K, M suffixes; default {DEFAULT_SIZES})")
    parser.add_argument("--fusion-arrays", type=int, default=100, help="arrays in the fusion case")
    parser.add_argument("--fusion-elements", type=int, default=10_000, help="float32 elements per array")


def run(context: Context, args) -> Dict[str, object]:
    comm = context.comm
    size = comm.Get_size()
    rows: List[Dict[str, object]] = []
    for nbytes in args.sizes:
        x = np.random.default_rng(comm.Get_rank()).random(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)
        candidates = {
            "native": lambda: comm.Allreduce(x, out, op=MPI.SUM),
            "ring": lambda: allreduce(x, algorithm="ring", comm=context, out=out, check=False),
            "auto": lambda: allreduce(x, comm=context, out=out, check=True),
            "auto_nocheck": lambda: allreduce(x, comm=context, out=out, check=False),
        }
        medians = interleaved_medians(comm, candidates, warmup=3, iterations=iterations_for(x.nbytes))
        for name in CANDIDATES:
            algbw = x.nbytes / medians[name] / 1e9
            rows.append({
                "bytes": x.nbytes, "algorithm": name, "median_s": medians[name],
                "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (size - 1) / size if size > 1 else algbw,
                "busbw_vs_native": medians["native"] / medians[name],
            })
    return {"benchmark": NAME, **launch_facts(comm), "rows": rows, "fusion": fusion(context, args)}


def fusion(context: Context, args) -> Dict[str, object]:
    """One allreduce_many over many small arrays against one native call per array."""
    comm = context.comm
    arrays = [np.full(args.fusion_elements, comm.Get_rank(), dtype=np.float32)
              for _ in range(args.fusion_arrays)]
    outs = [np.empty_like(a) for a in arrays]

    def one_call_each() -> None:
        for a, o in zip(arrays, outs):
            comm.Allreduce(a, o, op=MPI.SUM)

    medians = interleaved_medians(comm, {
        "native_per_array": one_call_each,
        "allreduce_many": lambda: allreduce_many(arrays, comm=context),
    }, warmup=3, iterations=30)
    return {"arrays": args.fusion_arrays, "elements": args.fusion_elements, **medians,
            "speedup": medians["native_per_array"] / medians["allreduce_many"]}


def render(result: Dict[str, object]) -> str:
    """The console table: busbw in GB/s and, in brackets, relative to native."""
    by_size: Dict[int, Dict[str, dict]] = {}
    for row in result["rows"]:
        by_size.setdefault(row["bytes"], {})[row["algorithm"]] = row
    lines = [f"allreduce, float32, {result['ranks']} ranks on {result['cores']} cores"
             f"{' (oversubscribed)' if result['oversubscribed'] else ''}, transport {result['transport']}",
             f"{'size':>9} " + " ".join(f"{name + ' busbw':>22}" for name in CANDIDATES)]
    for nbytes, rows in by_size.items():
        cells = [f"{rows[name]['busbw_GBps']:9.3f} GB/s ({rows[name]['busbw_vs_native']:4.2f}x)"
                 for name in CANDIDATES]
        lines.append(f"{format_size(nbytes):>9} " + " ".join(f"{cell:>22}" for cell in cells))
    f = result["fusion"]
    lines.append(f"fusion: {f['arrays']} x {f['elements']} float32: allreduce_many "
                 f"{f['allreduce_many'] * 1e3:.3f} ms, {f['arrays']} native calls "
                 f"{f['native_per_array'] * 1e3:.3f} ms ({f['speedup']:.1f}x faster)")
    return "\n".join(lines)
