"""Part ``rows`` of ``hpcreduce bench embeddings``: a sparse pull+push against raw point-to-point.

Ranks 0..K-1 serve an ASP sparse table of ``--width`` float32 columns; every other rank is a
worker that pulls ``--rows`` rows and pushes their gradients, both requests in flight together
(a step of an embedding model: read the batch's rows, send their gradients), then clocks. Each
call takes the next of ``ID_BATCHES`` distinct random id sets (so no call repeats the last
one's ids to a server). The peer moves the same bytes between the same ranks with
``Isend``/``Irecv``: per server, the ids and gradient rows it owns up, its rows down, in one
exchange. Blocks of PS and raw calls alternate in rotating order (``ps.Bench.compare``);
``ratio`` = raw time / PS time (1.0: the PS costs nothing over moving the bytes).
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from ..ps import Consistency, ParamSpec, start
from ..ps.init import PartInit
from ..runtime.context import Context
from .ps import Bench

TABLE = "embeddings"
ID_BATCHES = 8


def measure(context: Context, args) -> Dict[str, object]:
    """The rows case on K = ``args.servers`` servers; collective over every rank."""
    spec = ParamSpec(TABLE, (args.table_rows, args.width), sparse=True)
    role = start([spec], PartInit([spec], lambda _table, flat: np.zeros(len(flat), np.float32)),
                 servers=args.servers, consistency=Consistency("asp"), optimizer="sgd", lr=1e-6, comm=context)
    bench = Bench(context.comm, role, args)
    layout, row_bytes = role.layout, args.width * 4
    table = layout.table_ids[TABLE]
    batches = {slot: id_batches(slot, args.rows, args.table_rows) for slot in layout.worker_slots}
    calls = {slot: 0 for slot in layout.worker_slots}
    grads = np.full((len(batches[layout.worker_slots[0]][0]), args.width), 1e-3, np.float32)

    def pull_push(worker) -> None:
        ids = batches[worker.slot][calls[worker.slot] % ID_BATCHES]
        calls[worker.slot] += 1
        pull, push = worker.pull_rows_async(TABLE, ids), worker.push_rows_async(TABLE, ids, grads)
        pull.wait()
        push.wait()

    def raw_bytes(slot: int) -> Dict[int, tuple]:
        """Per server rank, (bytes up, bytes down): ids and gradient rows up, rows down."""
        owners = layout.placement.row_owners(table, batches[slot][0])
        keys, counts = np.unique(owners, return_counts=True)
        return {bench.rank_of(int(k)): ((8 + row_bytes) * int(c), row_bytes * int(c)) for k, c in zip(keys, counts)}

    seconds = bench.compare(pull_push, raw_bytes, reps=args.reps)
    bench.worker_comm.Free()
    moved = len(grads) * bench.worker_count
    return {"servers": args.servers, "workers": bench.worker_count, "rows": len(grads), "width": args.width,
            "table_rows": args.table_rows, **seconds,
            "ps_rows_per_s": moved / seconds["ps_s"], "raw_rows_per_s": moved / seconds["raw_s"]}


def id_batches(slot: int, rows: int, table_rows: int) -> List[np.ndarray]:
    """``ID_BATCHES`` sorted sets of ``rows`` distinct ids below ``table_rows`` for worker ``slot``."""
    rng = np.random.default_rng([slot, rows, table_rows])
    return [np.sort(rng.choice(table_rows, size=min(rows, table_rows), replace=False)) for _ in range(ID_BATCHES)]


def render(row: Dict[str, object]) -> List[str]:
    return [f"rows: K={row['servers']} W={row['workers']}, pull+push of {row['rows']} ids x {row['width']} float32: "
            f"PS {row['ps_rows_per_s'] / 1e6:.3f} Mrows/s, raw Send/Recv {row['raw_rows_per_s'] / 1e6:.3f} Mrows/s, "
            f"PS/raw {row['ratio']:.2f}x"]
