"""Part ``scale`` of ``hpcreduce bench embeddings``: a stream of distinct ids through the servers.

K servers (ranks 0..K-1; with ``--replicas``, each also keeps its predecessor's shard, as
``--ft`` training does) hold one sparse table of ``--width`` float32 columns; the W workers
split a stream of ``--ids`` distinct ids and push a gradient for each, ``--push-rows`` ids a
push (ASP, a few pushes in flight), into a dynamic table (``--budget`` bytes a shard,
``--admit-after``, ``--eviction``). Ids are made, never stored: the stream's counter through
SplitMix64 (a bijection of 64-bit integers, so distinct). Measured: ids per second (the
slowest worker's), each worker's RSS at ``--rss-points`` points of its stream (flat in the
ids when nothing grows with them), each server's peak RSS against its base (RSS before the
stream) and its budgets (one per shard it holds: two with replicas), its load (bytes
received) and its summary's ``dynamic_rows``: rows and bytes held, ids seen without a row,
rows admitted (created) and evicted, gradient rows dropped.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Deque, Dict, List

import numpy as np

from ..arrays.hashing import mix64
from ..ps import Consistency, Dynamic, dynamic_table
from ..ps.handles import Handle
from ..ps.init import PartInit
from ..ps.roles import Tables, initial_layout, make_role
from ..ps.server import Server
from ..ps.shard_state import ShardState
from ..runtime.context import Context
from ..runtime.memory import peak_rss_bytes, rss_bytes
from ..runtime.nodes import rank_nodes
from .timing import format_size

TABLE = "stream"
IN_FLIGHT = 4
COLUMNS = ("rows", "seen", "admitted", "evicted", "dropped")  # of the summary's dynamic_rows, as printed


def stream_ids(begin: int, end: int) -> np.ndarray:
    """Ids number ``begin``..``end``-1 of the stream: distinct int64 (a bijective hash of the number)."""
    with np.errstate(over="ignore"):
        return mix64(np.arange(begin, end, dtype=np.uint64)).view(np.int64)


def measure(context: Context, args) -> Dict[str, object]:
    """The stream on K = ``args.servers`` servers; collective; the figures on rank 0 (an empty dict elsewhere)."""
    spec = dynamic_table(TABLE, args.width, Dynamic(admit_after=args.admit_after, budget_bytes=args.budget,
                                                    eviction=args.eviction))
    tables = Tables.of([spec], "sgd", 1e-3, Consistency("asp"))
    layout = initial_layout(context, tables, args.servers, rank_nodes(context.comm), replicated=args.replicas)
    zeros = PartInit([spec], lambda _table, flat: np.zeros(len(flat), np.float32))

    def shards(key: int) -> List[ShardState]:
        keys = [key, layout.neighbours(key)[1]] if args.replicas and len(layout.shard_ranks) > 1 else [key]
        return ShardState.create_many(layout, keys, zeros, tables.optimizers)
    role = make_role(context, layout, tables, shards)
    mine = serve(role) if isinstance(role, Server) else push_stream(role, args)
    found = context.comm.gather(mine, root=0)
    if context.rank != 0:
        return {}
    servers = [entry for entry in found if entry["role"] == "server"]
    workers = [entry for entry in found if entry["role"] == "worker"]
    loads = np.array([entry["received_bytes"] for entry in servers], np.float64)
    seconds = max(entry["seconds"] for entry in workers)
    return {"servers": args.servers, "workers": len(workers), "replicas": args.replicas,
            "ids": args.ids, "width": args.width, "push_rows": args.push_rows, "budget_bytes": args.budget,
            "shards_per_server": 2 if args.replicas and args.servers > 1 else 1, "admit_after": args.admit_after,
            "eviction": args.eviction, "seconds": seconds,
            "ids_per_s": args.ids / seconds, "load_max_over_mean": float(loads.max() / loads.mean()),
            "server": servers, "worker": workers}


def serve(server: Server) -> Dict[str, object]:
    """Serve the stream; this server's memory, load and table counters."""
    base = rss_bytes()
    server.serve()
    return {"role": "server", "shard": server.state.shard, "base_rss_bytes": base, "peak_rss_bytes": peak_rss_bytes(),
            "received_bytes": sum(cell[1] for cell in server.state.traffic.values()),
            "dynamic_rows": server.state.summary()["dynamic_rows"]}


def push_stream(worker, args) -> Dict[str, object]:
    """Push one gradient row for each id of this worker's part of the stream; its time and RSS."""
    workers = worker.layout.worker_count
    index = worker.layout.worker_slots.index(worker.slot)
    first, last = args.ids * index // workers, args.ids * (index + 1) // workers
    grads = np.full((args.push_rows, args.width), 1e-3, np.float32)
    pushes = -(-(last - first) // args.push_rows)
    marks = set(np.linspace(0, pushes, args.rss_points, endpoint=False).astype(np.int64).tolist())
    rss: List[Dict[str, int]] = []
    pending: Deque[Handle] = deque()
    began = time.perf_counter()
    for number, begin in enumerate(range(first, last, args.push_rows)):
        ids = stream_ids(begin, min(last, begin + args.push_rows))
        pending.append(worker.push_rows_async(TABLE, ids, grads[:len(ids)]))
        worker.clock()  # one push per table per step
        if len(pending) > IN_FLIGHT:
            pending.popleft().wait()
        if number in marks:
            rss.append({"ids_pushed": begin - first, "rss_bytes": rss_bytes()})
    for handle in pending:
        handle.wait()
    seconds = time.perf_counter() - began
    worker.release()
    rss.append({"ids_pushed": last - first, "rss_bytes": rss_bytes()})
    return {"role": "worker", "slot": worker.slot, "ids": last - first, "seconds": seconds, "rss": rss,
            "peak_rss_bytes": peak_rss_bytes()}


def render(result: Dict[str, object]) -> List[str]:
    MiB = 1 << 20
    lines = [f"scale: {result['ids']} distinct ids x {result['width']} float32 through a dynamic table, "
             f"K={result['servers']}{' with replicas' if result['replicas'] else ''}, W={result['workers']}, "
             f"budget {format_size(result['budget_bytes']) if result['budget_bytes'] else 'unbounded'} a shard: "
             f"{result['ids_per_s'] / 1e6:.3f} M ids/s, "
             f"server load max/mean {result['load_max_over_mean']:.3f}",
             f"  {'shard':>5} {'base MiB':>9} {'peak MiB':>9} {'(peak-base)/budgets':>19} {'held MiB':>9} "
             + " ".join(f"{name:>10}" for name in COLUMNS)]
    held_budget = result["budget_bytes"] * result["shards_per_server"]  # a replica has its own budget
    for server in result["server"]:
        over = (server["peak_rss_bytes"] - server["base_rss_bytes"]) / held_budget if held_budget else float("nan")
        rows = server["dynamic_rows"]
        lines.append(f"  {server['shard']:>5} {server['base_rss_bytes'] / MiB:9.1f} "
                     f"{server['peak_rss_bytes'] / MiB:9.1f} {over:19.2f} {rows['bytes'] / MiB:9.1f} "
                     + " ".join(f"{rows[name]:>10}" for name in COLUMNS))
    for worker in result["worker"]:
        points = ", ".join(f"{point['rss_bytes'] / MiB:.0f}" for point in worker["rss"])
        lines.append(f"  worker slot {worker['slot']}: RSS (MiB) along its {worker['ids']} ids: {points}")
    return lines
