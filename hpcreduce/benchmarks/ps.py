"""``hpcreduce bench ps``: parameter-server pulls and pushes against raw Send/Recv.

For each number of servers K (``--servers``, default every K from 1 to N-1), ranks
0..K-1 serve an ASP parameter server with SGD and the other N-K ranks are workers.

- dense: every worker pushes a float32 table of each ``--sizes`` and pulls it back
  (both requests in flight together), then clocks (``push+pull``); and the same with
  the fused push-pull (``push-pull``: one request per piece brings the values back,
  ps-lite's ZPushPull), in the same rotation. The peer is raw point-to-point:
  each worker sends the same bytes to the same servers (the table's pieces), which
  send them back, with ``Isend``/``Irecv``/``Waitall`` and nothing else.
- latency: a pull of a 64 B table (one small request, no clock) against a raw round
  trip of 64 B each way: a request's fixed cost; and ``python_floor``'s bare request loop of
  the same shape, in the same rotation: what any server written in Python pays.
- idle server: the servers' CPU share (process time / wall time, the busiest server's)
  while the workers send nothing for ``IDLE_S``: an idle server must not spin.
- sparse: ``pull_rows`` and ``push_rows`` of ``--rows`` random rows of a
  ``--table-rows`` x ``--width`` float32 table; the peer moves the same bytes
  (ids and rows) between the same pairs. The PS sends the same ids every call, so
  after the first its requests name the cached id list instead (key caching).
- ``--wire-dtype float16``: the PS moves float16 values and the raw peer the same bytes.

Blocks of calls rotate (PS, raw, raw+update), (raw, raw+update, PS), ... so machine
drift hits all alike. A block's time is the slowest worker's; figures are medians over
blocks. ``ratio`` = raw time / PS time (1.0: PS costs nothing over moving the bytes).
For dense tables, ``raw+update`` is the raw exchange in which the server also does
what a PS server must do with a push (the NaN/Inf check and the SGD update) before
sending back; ``ratio_same_arithmetic`` = its time / PS time isolates the protocol's
own cost (headers, probes, queues) from the arithmetic.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..ps import Consistency, ParamSpec, Server, start
from ..arrays.finite import all_finite
from ..ps.optimizers import make_optimizer
from ..runtime.context import Context
from . import python_floor
from .timing import format_size, launch_facts

NAME = "ps"
HELP = "parameter-server pull/push bandwidth and rows/s against raw Send/Recv, by servers K"
DEFAULT_SIZES = "4K,64K,1M,16M"
TAG_RAW = 7401
SMALL_TABLE = "small"
IDLE_S = 1.0  # the idle case: seconds the workers send nothing
# ps-lite (its dense push+pull test, 1 MiB, 2 processes) measured on the reference machine
PS_LITE_GBPS_1MIB = 0.57


def run(context: Context, args) -> Dict[str, object]:
    comm, size = context.comm, context.size
    counts = [args.servers] if args.servers is not None else list(range(1, size))
    rows: List[Dict[str, object]] = []
    for servers in counts:
        rows += measure(context, servers, args)
    return {"benchmark": NAME, **launch_facts(comm), "wire_dtype": args.wire_dtype,
            "rows": rows}


def measure(context: Context, servers: int, args) -> List[Dict[str, object]]:
    """Every case for one K; collective over all ranks (a bad K raises PSConfigError on each)."""
    specs = [ParamSpec(f"dense{n}", (max(1, n // 4),)) for n in args.sizes]
    specs.append(ParamSpec(SMALL_TABLE, (16,)))
    specs.append(ParamSpec("sparse", (args.table_rows, args.width), sparse=True))
    role = start(specs, lambda: {s.name: np.zeros(s.shape, s.dtype) for s in specs},
                 servers=servers, consistency=Consistency("asp"), optimizer="sgd", lr=1e-6, comm=context,
                 wire_dtype=args.wire_dtype)
    bench = Bench(context.comm, role, args)
    wire = np.dtype(args.wire_dtype)
    rows = []
    for spec in specs[:-2]:
        table, pulled = np.ones(spec.shape, np.float32), np.empty(spec.shape, np.float32)
        pieces = {bench.rank_of(p.shard): p.size * wire.itemsize for p in role.layout.placement.pieces[
            role.layout.table_ids[spec.name]]}

        def dense_ps(worker, grad=table, out=pulled, name=spec.name):
            push, pull = worker.push_async(name, grad), worker.pull_async(name, out=out)
            push.wait()
            pull.wait()

        def fused(worker, grad=table, out=pulled, name=spec.name):
            worker.push_pull(name, grad, out=out, ends_step=True)
        seconds = bench.compare({"ps": dense_ps, "push_pull": fused},
                                lambda _w, p=pieces: {r: (n, n) for r, n in p.items()},
                                reps=reps_for(table.nbytes), kinds=("ps", "push_pull", "raw", "raw_update"))
        for case, kind in (("dense push+pull", "ps"), ("dense push-pull", "push_pull")):
            timed = {"ps_s": seconds[f"{kind}_s"], "raw_s": seconds["raw_s"], "raw_update_s": seconds["raw_update_s"]}
            rows.append({"servers": servers, "workers": bench.worker_count, "case": case,
                         "bytes": table.nbytes, **timed, "ratio": timed["raw_s"] / timed["ps_s"],
                         "ratio_same_arithmetic": timed["raw_update_s"] / timed["ps_s"],
                         **{f"{k}_GBps": 2 * table.nbytes * bench.worker_count / timed[f"{k}_s"] / 1e9
                            for k in ("ps", "raw", "raw_update")}})
    rows.append(bench.latency_case(servers))
    rows.append(bench.idle_case(servers))
    rows += bench.sparse_cases(servers)
    bench.worker_comm.Free()
    return rows


def written(nbytes: int) -> np.ndarray:
    """A buffer whose pages are all written (an untouched one maps the zero page, which
    would flatter raw transfers): float32 ones, as bytes."""
    return np.ones(-(-nbytes // 4), np.float32).view(np.uint8)[:nbytes]


def reps_for(nbytes: int) -> int:
    return int(min(50, max(3, (64 << 20) // max(nbytes, 1))))


class Bench:
    """Alternating PS and raw blocks on one layout."""

    def __init__(self, comm: MPI.Intracomm, role, args):
        self.comm, self.role, self.args = comm, role, args
        self.is_server = isinstance(role, Server)
        self.worker_count = role.layout.worker_count
        self.worker_comm = comm.Split(0 if not self.is_server else 1, comm.Get_rank())

    def rank_of(self, shard: int) -> int:
        return self.role.layout.shard_ranks[shard]

    def compare(self, ps_call, raw_bytes: Callable, reps: int,
                kinds: Sequence[str] = ("ps", "raw"), clock: bool = True) -> Dict[str, float]:
        """Median time per call of each kind, blocks in rotating order: ``ps`` calls
        ``ps_call(worker)`` (a dict of calls: each named kind calls its own); ``raw`` moves the (up, down) bytes per server rank that
        ``raw_bytes(slot)`` gives; ``raw_update`` also runs the server's arithmetic
        (NaN check and SGD update) on what it received and sends the parameters back.
        ``clock``: the worker ends each PS call with ``clock()`` (a push needs a new step)."""
        calls = ps_call if isinstance(ps_call, dict) else {"ps": ps_call}
        times: Dict[str, List[float]] = {kind: [] for kind in kinds}
        for round_index in range(self.args.rounds + 1):
            for shift in range(len(kinds)):
                kind = kinds[(round_index + shift) % len(kinds)]
                elapsed = self._block(kind, calls.get(kind), raw_bytes, reps, clock)
                if round_index:
                    times[kind].append(elapsed / reps)
        medians = np.array([np.median(times[kind]) for kind in kinds])
        self.comm.Allreduce(MPI.IN_PLACE, medians, op=MPI.MAX)
        found = {f"{kind}_s": float(m) for kind, m in zip(kinds, medians)}
        found["ratio"] = found["raw_s"] / found["ps_s"]
        if "raw_update" in kinds:
            found["ratio_same_arithmetic"] = found["raw_update_s"] / found["ps_s"]
        return found

    def _block(self, kind: str, ps_call: Optional[Callable], raw_bytes: Callable, reps: int,
               clock: bool) -> float:
        """One block of ``reps`` calls: PS ones (``ps_call``) or raw transfers of ``kind``."""
        if self.is_server:
            if ps_call is not None:
                self.role.serve()
            elif kind == "python_loop":
                mine = self._served(raw_bytes)
                python_floor.answer(self.comm, reps * len(mine), max((down for _, down in mine.values()), default=0))
            else:
                self._raw_server(raw_bytes, reps, arithmetic=kind == "raw_update")
            return 0.0
        worker = self.role
        self.worker_comm.Barrier()
        began = time.perf_counter()
        if ps_call is not None:
            worker.reopen()  # each block is a serving session that ends with release()
            for _ in range(reps):
                ps_call(worker)
                if clock:
                    worker.clock()
        elif kind == "python_loop":
            python_floor.ask(self.comm, raw_bytes(worker.slot), reps)
        else:
            self._raw_worker(raw_bytes(worker.slot), reps)
        elapsed = time.perf_counter() - began
        if ps_call is not None:
            worker.release()
        return elapsed

    def _raw_worker(self, pairs: Dict[int, Tuple[int, int]], reps: int) -> None:
        up = {rank: written(n) for rank, (n, _) in pairs.items()}
        down = {rank: written(n) for rank, (_, n) in pairs.items()}
        for _ in range(reps):
            requests = [self.comm.Isend(up[rank], rank, TAG_RAW) for rank in pairs]
            requests += [self.comm.Irecv(down[rank], rank, TAG_RAW) for rank in pairs]
            MPI.Request.Waitall(requests)

    def _served(self, raw_bytes: Callable) -> Dict[int, Tuple[int, int]]:
        """The worker ranks that send this server rank something: rank -> (bytes up, bytes down)."""
        me = self.comm.Get_rank()
        mine = {rank: raw_bytes(w).get(me) for w, rank in enumerate(self.role.layout.worker_ranks)}
        return {rank: pair for rank, pair in mine.items() if pair is not None}

    def _raw_server(self, raw_bytes: Callable, reps: int, *, arithmetic: bool) -> None:
        mine = self._served(raw_bytes)
        up = {rank: written(n) for rank, (n, _) in mine.items()}
        down = {rank: written(n) for rank, (_, n) in mine.items()}
        optimizer = make_optimizer("sgd", 1e-6)
        for _ in range(reps):
            MPI.Request.Waitall([self.comm.Irecv(up[rank], rank, TAG_RAW) for rank in mine])
            if arithmetic:
                for rank in mine:
                    grad, param = up[rank].view(np.float32), down[rank].view(np.float32)
                    if all_finite(grad):
                        optimizer.update(param, grad, {}, 1)
            MPI.Request.Waitall([self.comm.Isend(down[rank], rank, TAG_RAW) for rank in mine])

    def latency_case(self, servers: int) -> Dict[str, object]:
        """A pull of the 64 B table against a raw 64 B round trip to the same server."""
        layout = self.role.layout
        (piece,) = layout.placement.pieces[layout.table_ids[SMALL_TABLE]]
        rank = self.rank_of(piece.shard)
        nbytes = piece.size * np.dtype(self.args.wire_dtype).itemsize
        out = np.empty(piece.size, np.float32)
        seconds = self.compare(lambda w: w.pull(SMALL_TABLE, out=out), lambda _w: {rank: (nbytes, nbytes)},
                               reps=200, kinds=("ps", "raw", "python_loop"), clock=False)
        return {"servers": servers, "workers": self.worker_count, "case": "latency (pull)",
                "bytes": nbytes, **seconds, "ps_us": seconds["ps_s"] * 1e6, "raw_us": seconds["raw_s"] * 1e6,
                "python_loop_us": seconds["python_loop_s"] * 1e6}

    def idle_case(self, servers: int) -> Dict[str, object]:
        """A server's CPU share while its workers send nothing for ``IDLE_S`` (it must not spin)."""
        began, cpu = time.perf_counter(), time.process_time()
        if self.is_server:
            self.role.serve()
        else:
            self.role.reopen()
            time.sleep(IDLE_S)
            self.role.release()
        share = np.array([(time.process_time() - cpu) / (time.perf_counter() - began) if self.is_server else 0.0])
        self.comm.Allreduce(MPI.IN_PLACE, share, op=MPI.MAX)
        return {"servers": servers, "workers": self.worker_count, "case": "idle server",
                "idle_s": IDLE_S, "cpu_share": float(share[0])}

    def sparse_cases(self, servers: int) -> List[Dict[str, object]]:
        """pull_rows and push_rows of the same random rows, against raw transfers of their bytes."""
        args, layout = self.args, self.role.layout
        table = layout.table_ids["sparse"]
        row_bytes = args.width * np.dtype(args.wire_dtype).itemsize

        def ids_of(slot: int) -> np.ndarray:
            rng = np.random.default_rng([slot, args.rows])
            return np.sort(rng.choice(args.table_rows, size=min(args.rows, args.table_rows), replace=False))

        def per_server(slot: int) -> Dict[int, int]:
            owners = layout.placement.row_owners(table, ids_of(slot))
            keys, counts = np.unique(owners, return_counts=True)
            return {self.rank_of(int(k)): int(c) for k, c in zip(keys, counts)}

        grads = np.full((len(ids_of(0)), args.width), 1e-3, np.float32)
        cases = {
            "pull_rows": (lambda w: w.pull_rows("sparse", ids_of(w.slot)),
                          lambda w: {r: (8 * c, row_bytes * c) for r, c in per_server(w).items()}),
            "push_rows": (lambda w: w.push_rows("sparse", ids_of(w.slot), grads),
                          lambda w: {r: ((8 + row_bytes) * c, 0) for r, c in per_server(w).items()}),
        }
        rows = []
        for case, (ps_call, raw_bytes) in cases.items():
            seconds = self.compare(ps_call, raw_bytes, reps=20)
            rate = len(grads) * self.worker_count
            rows.append({"servers": servers, "workers": self.worker_count, "case": case,
                         "rows": len(grads), "width": args.width, **seconds,
                         "ps_rows_per_s": rate / seconds["ps_s"], "raw_rows_per_s": rate / seconds["raw_s"]})
        return rows


def render(result: Dict[str, object]) -> str:
    """The console table: PS and raw rates, PS/raw, and (dense) PS against raw transfers
    that also do the server's arithmetic (the protocol's own cost)."""
    lines = [f"parameter server, float32 tables, {result.get('wire_dtype', 'float32')} on the wire, "
             f"{result['ranks']} ranks on {result['cores']} cores"
             f"{' (oversubscribed)' if result['oversubscribed'] else ''}, transport {result['transport']}",
             f"{'K':>2} {'W':>2} {'case':<16} {'size':>9} {'PS':>16} {'raw Send/Recv':>16} {'PS/raw':>7}"
             f" {'PS/(raw+update)':>16}"]
    for row in result["rows"]:
        if "cpu_share" in row:
            lines.append(f"{row['servers']:>2} {row['workers']:>2} {row['case']:<16} {'-':>9} "
                         f"{100 * row['cpu_share']:>11.1f} % of a core while idle {row['idle_s']:g} s")
            continue
        if "ps_us" in row:
            lines.append(f"{row['servers']:>2} {row['workers']:>2} {row['case']:<16} {format_size(row['bytes']):>9} "
                         f"{row['ps_us']:>13.1f} us {row['raw_us']:>13.1f} us {row['ratio']:>6.2f}x {'-':>16}")
            lines.append(f"{'':>5} the least a request costs in Python (python_floor): {row['python_loop_us']:.1f} us, "
                         f"{row['python_loop_us'] / row['raw_us']:.1f}x raw")
            continue
        if "bytes" in row:
            size, unit, key = format_size(row["bytes"]), "GB/s", "GBps"
            scale = 1.0
        else:
            size, unit, key = f"{row['rows']}x{row['width']}", "Mrows/s", "rows_per_s"
            scale = 1e-6
        ps, raw = (f"{row[f'{kind}_{key}'] * scale:.3f} {unit}" for kind in ("ps", "raw"))
        same = f"{row['ratio_same_arithmetic']:.2f}x" if "ratio_same_arithmetic" in row else "-"
        lines.append(f"{row['servers']:>2} {row['workers']:>2} {row['case']:<16} {size:>9} "
                     f"{ps:>16} {raw:>16} {row['ratio']:>6.2f}x {same:>16}")
    at_1mib = [row for row in result["rows"] if row.get("bytes") == 1 << 20 and "ps_GBps" in row]
    ours = ", ".join(f"K={row['servers']} W={row['workers']} {row['case'][6:]}: {row['ps_GBps']:.2f} GB/s"
                     for row in at_1mib)
    lines.append(f"side by side at 1 MiB dense push+pull: ps-lite {PS_LITE_GBPS_1MIB:.2f} GB/s (measured on the "
                 f"reference machine); hpcreduce {ours or 'not run (add 1M to --sizes)'}")
    return "\n".join(lines)
