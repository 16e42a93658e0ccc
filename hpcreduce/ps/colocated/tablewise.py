"""``TableWiseTables``: every table whole on one trainer rank, pooled there (TorchRec's
``ShardingType.TABLE_WISE``).

    tables = TableWiseTables(specs, optimizer="sgd", lr=0.01, comm=comm)      # collective
    pooled = tables.pool_async(lookups).wait()          # per table: its bags' pooled rows
    tables.push_pooled_async(grads, scale=1 / trainers).wait()   # the bags' gradients
    tables.clock()

Tables go to ranks greedily by bytes (largest first, each to the least loaded rank; the same
on every rank from the specs alone: ``owners``). A forward sends each table's lookups (bag
lengths, ids, per-lookup factors when weighted or MEAN) to the table's owner with the count
header of ``exchange`` (one round, checked on every rank before anything moves: ``checks.refuse``);
the owner pools each bag whole, in the bag's id order, with ``embedding_bag`` (the trainer's
own fused lookup: the same bits whatever the layout), and the pooled rows come back through an
``Ialltoallv``. The backward sends the bags' pooled gradients to the owners; the owner turns
them into row gradients (``kernels.pool.pooled_rows``: per sender in rank order, then bag
order, scaled by 1/trainers, summed over senders: the row-wise path's sums) and applies them
once with the tables' optimizer. Bytes per step: ids and lengths, and two batch x dim per
feature, against the rows and their gradients of row-wise sharding.

``pull_rows_many_async`` reads rows from their owners (``save_tables`` writes them; any
layout and number of ranks loads them); ``save_checkpoint``/``load_checkpoint`` keep the
optimizer state too, loadable at any number of ranks (``tablewise_checkpoint``). Under fault tolerance each owner's tables are
replicated on its ring successor and a lost owner's tables recovered in place
(``tablewise_ft``); the placement and handles: ``tablewise_handles``. Fixed tables only
(dynamic ones: row-wise).
"""
from __future__ import annotations

import zlib
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from ...errors import PSInputError
from ...runtime.context import Comm, resolve
from ...runtime.failures import release, wait_all
from ...runtime.nodes import rank_nodes
from ..init import PartInit
from ..kernels import kernel
from ..optimizers import make_optimizer
from ..layout import node_ring
from ..tables import ParamSpec
from . import checks, exchange, tablewise_checkpoint
from .checks import Lookups
from .exchange import HEAD
from .flat import offsets
from .routes import byte_spec
from .shards import default_init
from .tablewise_ft import Recoverable, forward, neighbour, owner_keys, replicate
from .tablewise_handles import PooledPush, PoolHandle, RowsHandle, owners, row_bytes
from .tablewise_rows import FirstTouch, per_row, zeroed_state

POOLED_ROWS = kernel("pool", "pooled_rows")
BAG_OF = kernel("route", "bag_of")
WORD = 8  # an id or a bag length: int64


class TableWiseTables(Recoverable):
    """Sparse fixed tables ``specs``, each whole on one rank of ``comm`` (``owners``); see the
    module docstring. ``init``: a ``ps.init.PartInit`` (default ``default_init(specs, seed)``);
    ``empty``: no table at all, for ``grown_from`` to fill (a growth)."""

    def __init__(self, specs: Sequence[ParamSpec], *, optimizer: str = "sgd", lr: float = 0.01,
                 comm: Comm = None, init: Optional[PartInit] = None, seed: int = 0, empty: bool = False):
        context = resolve(comm)
        self.comm = context.comm.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.ft, self.specs = context.ft, tuple(specs)
        problem = checks.spec_problem(self.specs, optimizer, lr, init)
        if problem is None and any(spec.dynamic is not None for spec in self.specs):
            problem = "table-wise sharding holds fixed tables only: use sharding=\"row_wise\" for dynamic ones"
        checks.agree_on_setup(self.comm, problem, {"tables": list(self.specs), "optimizer": optimizer,
                                                   "learning rate": lr, "seed": seed})
        size = self.comm.Get_size()
        self.key, self.live = self.comm.Get_rank(), tuple(range(size))  # shard keys: ranks at start, for life
        self.ring = tuple(node_ring(self.live, dict(zip(self.live, rank_nodes(self.comm)))))
        self.home = owners(self.specs, size)
        self._locate()
        lazy = [per_row(init, t) for t in range(len(self.specs))]
        self.touch = FirstTouch(default_init(self.specs, seed) if init is None else init)
        self.optimizer = make_optimizer(optimizer, lr)
        self.values = checks.made_everywhere(self.comm, lambda: {} if empty else {
            t: self.touch.empty("primary", t) if lazy[t] else self.touch.whole(t) for t in self.mine})
        self.state = {t: zeroed_state(self.optimizer, values) for t, values in self.values.items()}
        self.row_bytes = np.array([row_bytes(spec) for spec in self.specs], np.int64)
        self.last_step = {t: -1 for t in self.mine}
        self.clock_value = 0
        self.released = False
        self._forward: Optional[List[Tuple[np.ndarray, ...]]] = None  # my tables' last lookups with grad
        self._pushes: List[PooledPush] = []
        self._pools: List[PoolHandle] = []
        self.replicas: Dict[int, Tuple[np.ndarray, Dict[str, np.ndarray]]] = {}  # the predecessor's tables
        if empty:
            self._install({})
        elif self._replicated and all(lazy):  # the predecessor's tables, drawn here as there
            self._install({t: (rows, zeroed_state(self.optimizer, rows), -1) for t in self._theirs()
                           for rows in [self.touch.empty("replica", t)]})
        elif self._replicated:
            self._install(replicate(self.comm, self.successor, self.predecessor,
                                    {t: (self.values[t], self.state[t], -1) for t in self.mine}))

    @property
    def worker_count(self) -> int:
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def _replicated(self) -> bool:
        """Replicas are kept under fault tolerance, on two ranks or more."""
        return self.ft and self.worker_count > 1

    def _locate(self) -> None:
        """Each table's owner rank (a key's rank is its place among the live keys: survivors
        keep their order), this rank's tables and its ring neighbours' ranks."""
        keys = owner_keys(self.home, self.ring, self.live)
        rank_of = {key: rank for rank, key in enumerate(self.live)}
        self.owner = np.array([rank_of[int(key)] for key in keys], np.int64)
        self.mine = np.flatnonzero(keys == self.key).tolist()
        self.successor = rank_of[neighbour(self.ring, self.live, self.key)]
        self.predecessor = rank_of[neighbour(self.ring, self.live, self.key, -1)]

    def _theirs(self) -> List[int]:
        """The tables of this rank's ring predecessor (this rank's replicas)."""
        return np.flatnonzero(self.owner == self.predecessor).tolist()

    def _install(self, replicas: dict) -> None:
        self.replicas = {t: (rows, state) for t, (rows, state, _) in replicas.items()}
        self.replica_step = {t: step for t, (_, _, step) in replicas.items()}

    # -- a step ------------------------------------------------------------------------
    def pool_async(self, lookups: Sequence[Lookups], problem: Optional[str] = None) -> PoolHandle:
        """Start pooling every table's bags (``lookups[t]``: ids, bag lengths, factors or None;
        factors for every table or none) at its owner; collective. ``problem``: this rank's
        input is bad (raised on every rank, nothing sent). Under grad mode the owners keep the
        lookups for the step's push."""
        self._check_open("pool_async()")
        return self._collective(lambda: self._pool(lookups, problem))

    def _pool(self, lookups: Sequence[Lookups], problem: Optional[str]) -> PoolHandle:
        self._settle()
        count, grad = len(self.specs), torch.is_grad_enabled()
        if problem is None:
            problem = checks.lookups_problem(self.specs, lookups)
        lookups = lookups if problem is None else [(np.empty(0, np.int64),) * 2 + (None,)] * count
        weighted = any(factors is not None for _, _, factors in lookups)
        headers = self._headers(("pool", grad), problem, [len(ids) for ids, _, _ in lookups],
                                [len(lengths) for _, lengths, _ in lookups])
        parts = [self._joined([[lengths, ids] for ids, lengths, _ in lookups]),
                 self._joined([[factors if factors is not None else np.ones(len(ids), np.float32)]
                               for ids, _, factors in lookups]) if weighted else np.empty(0, np.uint8)]
        headers[:, 3] = self._sizes(headers, lambda t: np.int64(WORD), both=True)
        headers[:, 4] = self._sizes(headers, lambda t: np.int64(4)) if weighted else 0
        sends = exchange.post(self.comm, headers, parts)
        incoming, (asked, factors) = exchange.receive(self.comm, HEAD + 2 * count)
        checks.refuse(self.comm, "pool_async", problem, incoming, f"pool (grad {grad}) at step {self.clock_value}")
        wait_all(sends)
        reply, reply_sizes = self._pooled(incoming, asked, factors, grad)
        return self._arriving(reply, reply_sizes, [len(lengths) for _, lengths, _ in lookups])

    def push_pooled_async(self, grads: Sequence[Optional[np.ndarray]], scale: float = 1.0,
                          problem: Optional[str] = None) -> PooledPush:
        """Start sending the gradients of the last forward's pooled bags (``grads[t]``: bags x
        dim, or None: the loss did not reach table t); the owners scale them by ``scale``, make
        row gradients and apply them (at the next ``wait``, pool or clock). Collective;
        ``problem``: this rank's push is bad (raised on every rank, nothing applied)."""
        self._check_open("push_pooled_async()")
        return self._collective(lambda: self._push(grads, scale, problem))

    def _push(self, grads: Sequence[Optional[np.ndarray]], scale: float, problem: Optional[str]) -> PooledPush:
        count = len(self.specs)
        problem = problem or checks.pooled_grads_problem(self.specs, grads)
        if problem is not None:
            grads = [None] * count
        headers = self._headers(("push",), problem, [0] * count,
                                [0 if g is None else len(g) for g in grads])
        headers[:, 3] = self._sizes(headers, lambda t: self.row_bytes[t], both=False, bags=True)
        parts = [self._joined([[g] if g is not None else [] for g in grads]), np.empty(0, np.uint8)]
        push = PooledPush(lambda push: self._collective(lambda: self._settle(push)),
                          exchange.post(self.comm, headers, parts), scale,
                          (problem, f"push at step {self.clock_value}"))
        self._pushes.append(push)
        return push

    def pull_rows_many_async(self, ids_by_table: Mapping[str, np.ndarray]) -> RowsHandle:
        """Start reading rows of several tables (table -> ids) from their owners; ``wait()`` ->
        table -> rows aligned with its ids. Collective (``save_tables``, checks: a step pools)."""
        self._check_open("pull_rows_many_async()")
        return self._collective(lambda: self._pull(ids_by_table))

    def _pull(self, ids_by_table: Mapping[str, np.ndarray]) -> RowsHandle:
        self._settle()
        count, problem, asked = len(self.specs), None, {}
        try:
            asked = checks.pulled(ids_by_table, {spec.name: t for t, spec in enumerate(self.specs)}, self.specs)
        except PSInputError as error:
            problem = str(error)
        ids = [asked[t][0].astype(np.int64) if t in asked else np.empty(0, np.int64) for t in range(count)]
        headers = self._headers(("rows", sorted(asked)), problem, [len(i) for i in ids], [0] * count)
        headers[:, 3] = self._sizes(headers, lambda t: np.int64(WORD))
        sends = exchange.post(self.comm, headers, [self._joined([[i] for i in ids]), np.empty(0, np.uint8)])
        incoming, (wanted, _) = exchange.receive(self.comm, HEAD + 2 * count)
        checks.refuse(self.comm, "pull_rows_many_async", problem, incoming,
                      f"rows of {[self.specs[t].name for t in sorted(asked)]} at step {self.clock_value}")
        wait_all(sends)
        words, at, blocks = wanted.view(np.int64), 0, []
        for r in range(self.worker_count):
            for t in self.mine:
                n = int(incoming[r, HEAD + t])
                self.touch.make("primary", t, words[at:at + n])
                blocks.append(self.values[t][words[at:at + n]].reshape(-1).view(np.uint8))
                at += n
        reply = np.concatenate(blocks) if blocks else np.empty(0, np.uint8)
        reply_sizes = (incoming[:, HEAD:HEAD + count][:, self.mine] * self.row_bytes[self.mine]).sum(1)
        return RowsHandle(self._arriving(reply, reply_sizes, [len(i) for i in ids]), asked, self.specs)

    def save_checkpoint(self, directory: str) -> None:
        """Write every table (rows, optimizer state) and the step to ``directory`` (collective)."""
        self._check_open("save_checkpoint()")
        self._collective(self._settle)
        self.touch.make_all()
        tablewise_checkpoint.save(self, directory)

    def load_checkpoint(self, directory: str) -> None:
        """Load what ``save_checkpoint`` wrote, at this or another number of ranks (collective)."""
        self._check_open("load_checkpoint()")
        self._collective(self._settle)
        tablewise_checkpoint.load(self, directory)

    def grown_from(self, old: Optional["TableWiseTables"]) -> None:
        """A growth (collective over every rank, the newcomers' too; these tables made ``empty``
        over them all): each table of ``old`` (this rank's tables of before, released here; None
        on a newcomer) goes whole to its owner here (``tablewise_checkpoint.grown``)."""
        tablewise_checkpoint.grown(self, old)

    def clock(self) -> int:
        """End this step: the pushes in flight applied; the new step."""
        self._check_open("clock()")
        self._collective(self._settle)
        self._forward = None
        self.clock_value += 1
        return self.clock_value

    def release(self) -> None:
        """Done (collective): the pushes in flight applied, the communicator freed."""
        self._check_open("release()")
        self._collective(self._settle)
        self.released = True
        release(self.comm)

    # -- internals ---------------------------------------------------------------------
    def _arriving(self, reply: np.ndarray, reply_sizes: np.ndarray, rows: Sequence[int]) -> PoolHandle:
        """Post the owners' replies (``reply``: ``reply_sizes`` bytes to each rank) and receive
        ``rows[t]`` rows of every table t from its owner (owners in rank order, then tables)."""
        pieces, start, sizes = [], 0, np.zeros(self.worker_count, np.int64)
        for d in range(self.worker_count):
            for t in np.flatnonzero(self.owner == d).tolist():
                size = rows[t] * int(self.row_bytes[t])
                pieces.append((t, start, size))
                start += size
                sizes[d] += size
        received = np.empty(start, np.uint8)
        request = self.comm.Ialltoallv(byte_spec(reply, reply_sizes), byte_spec(received, sizes))
        handle = PoolHandle(request, received, pieces, self.specs, self._collective)
        self._pools = [h for h in self._pools if not h.done] + [handle]
        return handle

    def _check_open(self, call: str) -> None:
        if self.released:
            raise PSInputError(f"{call} after release(): the table-wise tables take no call")

    def _headers(self, what: Tuple, problem: Optional[str], ids: Sequence[int], bags: Sequence[int]) -> np.ndarray:
        """Every destination's header row: problem, signature, step, then per table the ids and
        bags sent to it (a table's go to its owner only)."""
        count = len(self.specs)
        headers = np.zeros((self.worker_count, HEAD + 2 * count), np.int64)
        headers[:, :3] = int(problem is not None), zlib.crc32(repr(what).encode()) & 0x7FFFFFFF, self.clock_value
        headers[self.owner, HEAD + np.arange(count)] = ids
        headers[self.owner, HEAD + count + np.arange(count)] = bags
        return headers

    def _sizes(self, headers: np.ndarray, item: Callable[[int], int], both: bool = False,
               bags: bool = False) -> np.ndarray:
        """Bytes to each destination: per table ``item(t)`` bytes per id (and per bag: ``both``;
        per bag only: ``bags``)."""
        count = len(self.specs)
        width = np.array([item(t) for t in range(count)], np.int64)
        ids, lengths = headers[:, HEAD:HEAD + count], headers[:, HEAD + count:HEAD + 2 * count]
        return (lengths * width).sum(1) if bags else (ids * width).sum(1) + ((lengths * width).sum(1) if both else 0)

    def _joined(self, per_table: List[List[np.ndarray]]) -> np.ndarray:
        """Every table's arrays as bytes, tables grouped by owner rank (then in table order)."""
        blocks = [np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                  for t in np.argsort(self.owner, kind="stable").tolist() for a in per_table[t]]
        return np.concatenate(blocks) if blocks else np.empty(0, np.uint8)

    def _pooled(self, incoming: np.ndarray, asked: np.ndarray, factors: np.ndarray, grad: bool
                ) -> Tuple[np.ndarray, np.ndarray]:
        """The owner's reply: every sender's bags of my tables pooled, as bytes in (sender,
        table) order, and the bytes to each sender; under grad mode the lookups kept."""
        count, senders = len(self.specs), self.worker_count
        ids_in, bags_in = incoming[:, HEAD:HEAD + count], incoming[:, HEAD + count:HEAD + 2 * count]
        weighted = bool(incoming[:, 4].any())
        words = asked.view(np.int64)
        floats = factors.view(np.float32)
        at_word, at_float = offsets(incoming[:, 3] // WORD), offsets(incoming[:, 4] // 4)
        mine: List[List[Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]] = [[] for _ in self.mine]
        for r in range(senders):
            w, f = int(at_word[r]), int(at_float[r])
            for i, t in enumerate(self.mine):
                n, b = int(ids_in[r, t]), int(bags_in[r, t])
                lengths, ids = words[w:w + b], words[w + b:w + b + n]
                mine[i].append((ids, lengths, floats[f:f + n] if incoming[r, 4] else
                                (np.ones(n, np.float32) if weighted else None)))
                w, f = w + b + n, f + n
        pooled, kept = [], []
        for i, t in enumerate(self.mine):
            ids = np.concatenate([p[0] for p in mine[i]])
            lengths = np.concatenate([p[1] for p in mine[i]])
            scale = torch.from_numpy(np.concatenate([p[2] for p in mine[i]])) if weighted else None
            self.touch.make("primary", t, ids)
            values = torch.from_numpy(self.values[t])
            pooled.append(F.embedding_bag(torch.from_numpy(ids), values, torch.from_numpy(offsets(lengths)), mode="sum",
                                          per_sample_weights=scale).numpy() if len(lengths) else
                          np.empty((0, values.shape[1]), self.values[t].dtype))
            if grad:
                kept.append((ids, BAG_OF(lengths), np.empty(0, np.float32) if scale is None else scale.numpy(),
                             offsets(np.append(ids_in[:, t], 0)), offsets(np.append(bags_in[:, t], 0))))
        self._forward = kept if grad else self._forward
        width = self.row_bytes[self.mine]
        bag_starts = [offsets(np.append(bags_in[:, t], 0)) for t in self.mine]
        blocks = [pooled[i][bag_starts[i][r]:bag_starts[i][r + 1]].reshape(-1).view(np.uint8)
                  for r in range(senders) for i in range(len(self.mine))]
        reply = np.concatenate(blocks) if blocks else np.empty(0, np.uint8)
        return reply, (bags_in[:, self.mine] * width).sum(1)

    def _settle(self, through: Optional[PooledPush] = None) -> None:
        """Receive, check and apply the pushes in flight in the order they were made (all, or
        up to ``through``)."""
        while self._pushes and (through is None or not through.done):
            try:
                self._apply(self._pushes[0])
            except MPI.Exception:
                raise  # still listed: ``_collective`` abandons it
            except BaseException:
                self._pushes.pop(0)
                raise
            self._pushes.pop(0)

    def _apply(self, push: PooledPush) -> None:
        """One push: every sender's pooled gradients of my tables into row gradients, applied once."""
        count = len(self.specs)
        incoming, (grads, _) = exchange.receive(self.comm, HEAD + 2 * count)
        push.done = True
        wait_all(push.requests)
        problem, described = push.what
        checks.refuse(self.comm, "push_pooled_async", problem, incoming, described)
        bags_in = incoming[:, HEAD + count:HEAD + 2 * count]
        at, updates = offsets(incoming[:, 3]), []
        for i, t in enumerate(self.mine):
            if not bags_in[:, t].any() or self._forward is None or self.clock_value <= self.last_step[t]:
                continue
            ids, bag_of, factors, lookup_starts, bag_starts = self._forward[i]
            spec, width = self.specs[t], int(self.row_bytes[t])
            table = np.zeros((int(bag_starts[-1]), spec.shape[1]), spec.dtype)
            live = bags_in[:, t] > 0
            for r in np.flatnonzero(live).tolist():
                start = int(at[r]) + int((bags_in[r, self.mine[:i]] * self.row_bytes[self.mine[:i]]).sum())
                table[bag_starts[r]:bag_starts[r + 1]] = grads[start:start + int(bags_in[r, t]) * width] \
                    .view(spec.dtype).reshape(-1, spec.shape[1])
            updates.append((t, *POOLED_ROWS(ids, bag_of, factors, table, lookup_starts, live,
                                            np.dtype(spec.dtype).type(push.scale))))
        copies = forward(self.comm, self.clock_value, self.successor, updates, self.row_bytes,
                         [np.dtype(spec.dtype) for spec in self.specs]) if self._replicated else []
        self._commit()
        for t, rows, summed in updates:
            self.optimizer.update_rows(self.values[t], self.state[t], rows, summed, self.clock_value + 1)
            self.last_step[t] = self.clock_value
        for t, rows, summed in copies:
            if self.clock_value > self.replica_step[t]:
                self.touch.make("replica", t, rows)
                self.optimizer.update_rows(*self.replicas[t], rows, summed, self.clock_value + 1)
                self.replica_step[t] = self.clock_value
