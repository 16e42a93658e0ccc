"""``hpcreduce bench allreduce --device gpu``: the same race on cupy arrays, NCCL as the peer.

Each rank takes GPU ``local_rank % count`` (``open_device``), so several ranks may
share one GPU. Candidates, interleaved call by call per size, each call followed by
a wait for the stream so that its time covers the GPU work:

- ``ring`` and ``auto``: hpcreduce on the device arrays, by the path this launch uses
  (device buffers to a CUDA-aware MPI, or staged through pinned host memory);
- ``native``: ``MPI_Allreduce`` on the same arrays (CUDA-aware MPI) or on pinned host
  copies of them (copy down, reduce on the host, copy up);
- ``nccl``: ``ncclAllReduce`` through ``cupy.cuda.nccl``, one communicator over all ranks
  (its unique id broadcast over MPI). NCCL refuses two ranks on one GPU, so it is left
  out, with the reason in the notes, when ranks share one.

Every candidate's result is compared with native's; a mismatch is reported in the
notes and in each row's ``agrees_with_native``. ``pcie``: the host-device copy bandwidth
cupy measures here, and the staged path's busbw ceiling it implies (``pcie``).
"""
from __future__ import annotations

import socket
from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..collectives import allreduce, allreduce_many
from ..runtime.context import Context
from ..runtime.devices import open_device
from .pcie import copy_bandwidth
from .pcie import note as pcie_note
from .timing import fusion, interleaved_medians, iterations_for, launch_facts, size_rows

Where = Tuple[str, str]  # (host name, PCI bus id of the rank's GPU)


def run_gpu(context: Context, sizes: Sequence[int], args) -> Dict[str, object]:
    comm = context.comm
    open_device("gpu", comm)
    import cupy
    device = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream()
    where: List[Where] = comm.allgather((socket.gethostname(), cupy.cuda.Device(device).pci_bus_id))
    nccl_peer, nccl_note = nccl_allreduce(comm, where, stream)
    names = ["ring", "auto", "native"] + (["nccl"] if nccl_peer else [])
    peers = ("native", "nccl") if nccl_peer else ("native",)
    rows: List[Dict[str, object]] = []
    notes = [f"nccl: {nccl_note}"]
    for nbytes in sizes:
        host = np.random.default_rng(comm.Get_rank()).random(nbytes // 4, dtype=np.float32)
        x = cupy.asarray(host)
        outs = {name: cupy.empty_like(x) for name in names}
        calls = candidates(context, x, outs, nccl_peer)
        medians = interleaved_medians(comm, {name: synced(calls[name], stream) for name in names},
                                      warmup=3, iterations=iterations_for(x.nbytes))
        agreeing = agreement(comm, outs)
        for row in size_rows(x.nbytes, medians, comm.Get_size(), peers):
            row["agrees_with_native"] = agreeing[row["algorithm"]]
            rows.append(row)
        notes += [f"MISMATCH: {name} differs from native at {x.nbytes} bytes"
                  for name, ok in agreeing.items() if not ok]
    facts = {**launch_facts(comm), **gpu_facts(context, device, where)}
    title = (f"allreduce on {facts['gpu']}, float32, {facts['ranks']} ranks on {facts['gpus_used']} "
             f"GPU(s) ({facts['ranks_per_gpu']} per GPU), {facts['path']}, transport "
             f"{facts['transport']}; ratios against {peers[-1]}")
    pcie = copy_bandwidth(comm, stream, facts["ranks_per_gpu"])
    notes.append(pcie_note(pcie, facts["ranks_per_gpu"]))
    fused = gpu_fusion(context, args, stream)
    if not fused["agrees"]:
        notes.append("MISMATCH: allreduce_many or the per-array native calls gave a wrong sum")
    result = {"device": "gpu", **facts, "title": title, "candidates": names,
              "peer": peers[-1], "nccl": nccl_note, "rows": rows, "notes": notes, "fusion": fused, "pcie": pcie}
    if nccl_peer:
        nccl_peer.close()
    return result


def candidates(context: Context, x, outs: Dict[str, object],
               nccl_peer: Optional["NcclAllreduce"]) -> Dict[str, Callable[[], object]]:
    """Each candidate's call on ``x`` into its own ``outs`` entry."""
    calls: Dict[str, Callable[[], object]] = {
        "ring": lambda: allreduce(x, algorithm="ring", comm=context, out=outs["ring"], check=False),
        "auto": lambda: allreduce(x, comm=context, out=outs["auto"], check=True),
        "native": lambda: allreduce(x, algorithm="native", comm=context, out=outs["native"], check=False),
    }
    if nccl_peer:
        calls["nccl"] = lambda: nccl_peer(x, outs["nccl"])
    return calls


def synced(call: Callable[[], object], stream) -> Callable[[], None]:
    """``call``, then a wait for the stream: the time covers the GPU work it queued."""
    def timed() -> None:
        call()
        stream.synchronize()
    return timed


def agreement(comm: MPI.Intracomm, outs: Dict[str, object]) -> Dict[str, bool]:
    """Whether each candidate's result matches native's on every rank."""
    import cupy
    native = outs["native"]
    local = np.array([bool(cupy.allclose(out, native, rtol=1e-5, atol=1e-6)) for out in outs.values()],
                     dtype=np.int32)
    everywhere = np.empty_like(local)
    comm.Allreduce(local, everywhere, op=MPI.MIN)
    return {name: bool(ok) for name, ok in zip(outs, everywhere)}


class NcclAllreduce:
    """A float32 sum over one NCCL communicator that spans the MPI ranks."""

    def __init__(self, communicator, stream):
        self._communicator = communicator
        self._stream = stream

    def __call__(self, x, out) -> None:
        from cupy.cuda import nccl
        self._communicator.allReduce(x.data.ptr, out.data.ptr, x.size, nccl.NCCL_FLOAT32,
                                     nccl.NCCL_SUM, self._stream.ptr)

    def close(self) -> None:
        self._communicator.destroy()


def nccl_allreduce(comm: MPI.Intracomm, where: List[Where], stream) -> Tuple[Optional[NcclAllreduce], str]:
    """NCCL over all ranks (rank 0's unique id broadcast over MPI), or None and why not."""
    try:
        from cupy.cuda import nccl
        problem = None if nccl.available else "cupy was built without NCCL or cannot load it"
    except ImportError as err:
        problem = f"cupy.cuda.nccl does not import ({err})"
    problems = [p for p in comm.allgather(problem) if p is not None]
    if problems:
        return None, f"not measured: {problems[0]}"
    shared = [r for r, place in enumerate(where) if where.index(place) != r]
    if shared:
        first = where.index(where[shared[0]])
        return None, (f"not measured: NCCL refuses two ranks on one GPU (ranks {first} and "
                      f"{shared[0]} share {where[first][1]} on {where[first][0]})")
    unique_id = comm.bcast(nccl.get_unique_id() if comm.Get_rank() == 0 else None, root=0)
    try:
        communicator, failure = nccl.NcclCommunicator(comm.Get_size(), unique_id, comm.Get_rank()), None
    except Exception as err:  # nccl.NcclError and CUDA errors
        communicator, failure = None, f"{type(err).__name__}: {err}"
    failures = [f for f in comm.allgather(failure) if f is not None]
    if failures:
        if communicator is not None:
            communicator.destroy()
        return None, f"not measured: NCCL init failed ({failures[0]})"
    version = nccl.get_version()
    major, rest = divmod(version, 10000) if version >= 10000 else divmod(version, 1000)
    return NcclAllreduce(communicator, stream), (
        f"NCCL {major}.{rest // 100}.{rest % 100}, one communicator over {comm.Get_size()} ranks")


def gpu_facts(context: Context, device: int, where: List[Where]) -> Dict[str, object]:
    """The GPU, how many ranks share each, the path device buffers take to MPI."""
    import cupy
    properties = cupy.cuda.runtime.getDeviceProperties(device)
    name = properties["name"]
    per_gpu = Counter(where)
    return {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "gpus_visible": cupy.cuda.runtime.getDeviceCount(),
        "gpus_used": len(per_gpu),
        "ranks_per_gpu": max(per_gpu.values()),
        "cuda_aware": context.cuda_aware,
        "path": ("device buffers to CUDA-aware MPI" if context.cuda_aware
                 else "staged through pinned host memory"),
        "cupy": cupy.__version__,
    }


def gpu_fusion(context: Context, args, stream) -> Dict[str, object]:
    """allreduce_many over many small device arrays against one native call per array."""
    import cupy
    comm = context.comm
    arrays = [cupy.full(args.fusion_elements, comm.Get_rank(), dtype=cupy.float32)
              for _ in range(args.fusion_arrays)]
    outs = [cupy.empty_like(a) for a in arrays]

    def one_call_each() -> None:
        for a, o in zip(arrays, outs):
            allreduce(a, algorithm="native", comm=context, out=o, check=False)

    result = fusion(comm, synced(lambda: allreduce_many(arrays, comm=context), stream),
                    synced(one_call_each, stream), arrays)
    want = sum(range(comm.Get_size()))
    fused = allreduce_many(arrays, comm=context)
    local = all(bool((r == want).all()) for r in fused) and all(bool((o == want).all()) for o in outs)
    result["agrees"] = bool(comm.allreduce(int(local), op=MPI.MIN))
    return result
