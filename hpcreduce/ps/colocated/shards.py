"""``ColocatedTables``: every trainer rank holds a shard of every table; rows move by alltoall.

    tables = ColocatedTables(specs, optimizer="sgd", lr=0.01, comm=comm)   # collective
    rows = tables.pull_rows_many_async({"emb": ids}).wait()["emb"]          # every rank, each step
    tables.push_rows_many_async({"emb": (unique_ids, grads)}).wait()
    tables.clock()

The client surface of ``ps.Worker`` that an embedding collection calls, with no server
ranks: TorchRec's model-parallel (row-wise) sharding on hpcreduce's row store. Pulls and
pushes are collective: every rank makes the same calls (same tables, same step). A call
sends every rank a small count header (counts per table, the step, and this rank's input
problem) together with its items (``exchange``: one round); every rank checks all the headers
before anything is applied, so bad input raises ``PSInputError`` everywhere and changes
nothing. A pull sends its unique ids to their owners, the owners gather the rows and the rows
come back through an ``Ialltoallv`` that ``wait`` completes: two rounds. A push sends items
(an id, then its gradient) to the owners, and to the replica holders when replicated; ``wait``
receives, sums and applies them (``handles``): one round. Every table shares each message
(flat byte buffers moved by compiled passes, ``flat``); rows travel as raw bytes on the library's own duplicate of the
communicator. A pull first completes the pushes in flight, so it reads every step pushed
before it (BSP). Initial values are the servers' (``ps.init``): a function of (seed, table,
id), so colocated and dedicated layouts start equal and, under SGD, stay equal.
"""
from __future__ import annotations

import zlib
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import PSInputError
from ...runtime.context import Comm, resolve
from ...runtime.failures import abandon, release
from ...runtime.nodes import rank_nodes
from ..init import PartInit, counter_normal
from ..optimizers import make_optimizer
from ..tables import ParamSpec
from ..updates import joined
from . import checkpoint, checks, exchange
from .agreed_calls import AgreedCalls
from .exchange import HEAD
from .handles import ID_BYTES, PullHandle, PushHandle
from .layout import ColocatedLayout
from .moves import placed, replicate
from .recovery import Restored, rebuilt, restore
from .flat import move, natural_to_wire, offsets, regroup, word
from .routes import as_bytes, byte_spec, route
from .store import INIT_SCALE, ShardStore

Call = Tuple[str, Optional[str], int, str]  # what, this rank's problem, signature, description


def default_init(specs: Sequence[ParamSpec], seed: int) -> PartInit:
    """N(0, INIT_SCALE**2) values, each a function of (seed, table name, element) alone."""
    return PartInit(specs, lambda t, flat: counter_normal(seed, specs[t].name, flat, INIT_SCALE, specs[t].dtype))


class ColocatedTables(AgreedCalls):
    """Sparse tables ``specs`` sharded over every rank of ``comm``; see the module docstring.

    ``optimizer``/``lr``: the update rule the owners run; ``init``: a ``ps.init.PartInit``
    (default: ``default_init(specs, seed)``'s values, each row made on its first touch:
    ``store``); ``replicas``: keep each shard's replica on the next
    rank of the ring (default: when fault tolerance is on and there are two ranks or more);
    ``empty``: no row at all, for ``grown_from`` to fill (a growth).
    """

    def __init__(self, specs: Sequence[ParamSpec], *, optimizer: str = "sgd", lr: float = 0.01,
                 comm: Comm = None, init: Optional[PartInit] = None, seed: int = 0,
                 replicas: Optional[bool] = None, empty: bool = False):
        context = resolve(comm)
        self.comm = context.comm.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.ft = context.ft
        specs = tuple(specs)
        replicas = bool(context.ft if replicas is None else replicas) and self.comm.Get_size() > 1
        checks.agree_on_setup(self.comm, checks.spec_problem(specs, optimizer, lr, init),
                              {"tables": list(specs), "optimizer": optimizer, "learning rate": lr, "seed": seed,
                               "replicas": replicas})
        size, rank = self.comm.Get_size(), self.comm.Get_rank()
        self.key = rank  # this rank's shard key, for life
        self.layout = ColocatedLayout(specs, range(size), rank_nodes(self.comm))
        self.optimizers = {t: make_optimizer(optimizer, lr) for t in range(len(specs))}
        lazy = seed if init is None else None  # the default rows are made on first touch (``store``)
        shard = (lambda key: ShardStore.empty(key, specs, self.optimizers, lazy)) if empty else \
            (lambda key: ShardStore.create(self.layout.placement, key, init, self.optimizers, lazy))
        self.store, self.replica = checks.made_everywhere(self.comm, lambda: (
            shard(rank), shard(self.layout.predecessor[rank]) if replicas else None))
        self.row_bytes = np.array([int(np.prod(s.shape[1:], dtype=np.int64)) * np.dtype(s.dtype).itemsize
                                   for s in specs], dtype=np.int64)
        self.unit = word(self.row_bytes)  # every buffer offset is a multiple of it
        self.clock_value = 0
        self.released = False
        self._pushes: List[PushHandle] = []
        self._pulls: List[PullHandle] = []

    @property
    def worker_count(self) -> int:
        """Trainer ranks (each holds a shard)."""
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    # -- the Worker surface ------------------------------------------------------------
    def pull_rows_many_async(self, ids_by_table: Mapping[str, np.ndarray]) -> PullHandle:
        """Start reading rows of several tables (table -> ids); ``wait()`` -> table -> rows
        aligned with its ids. Collective."""
        self._check_open("pull_rows_many_async()")
        self._settle()
        return self._collective(lambda: self._pull(ids_by_table))

    def _pull(self, ids_by_table: Mapping[str, np.ndarray]) -> PullHandle:
        """The pull: header and ids to their owners in one round, the owners' rows posted back."""
        mine, tables = self._prepared(lambda: checks.pulled(ids_by_table, self.layout.table_ids, self.layout.specs))
        dests = [self.layout.owner_ranks(t, tables[t][0]) if t in tables else np.empty(0, np.int64)
                 for t in range(len(self.layout.specs))]
        sent = route(dests, self.worker_count)
        ids = np.concatenate([tables[t][0] if t in tables else np.empty(0, np.int64)
                              for t in range(len(dests))]).astype(np.int64, copy=False)[sent.order]
        call = self._call("pull_rows_many", mine, sorted(tables))
        sends = self._post(call, sent.counts, [(ids.view(np.uint8), np.full(len(dests), ID_BYTES, np.int64))])
        incoming, (asked, _) = self._receive(call, len(dests))
        reply = self._gather(incoming, asked, sorted(tables))
        received = np.empty(int((sent.counts * self.row_bytes).sum()), np.uint8)
        request = self.comm.Ialltoallv(byte_spec(reply, (incoming * self.row_bytes).sum(1)),
                                       byte_spec(received, (sent.counts * self.row_bytes).sum(1)))
        handle = PullHandle(self.layout.specs, tables, sent, self.row_bytes, sends + [request], received,
                            self._collective, ids, self.layout)
        self._pulls = [h for h in self._pulls if not h.done] + [handle]
        return handle

    def push_rows_many_async(self, rows_by_table: Mapping[str, Tuple[np.ndarray, np.ndarray]]) -> PushHandle:
        """Start sending row gradients of several tables (table -> (unique ids, gradients)) for
        this step; ``wait()`` -> table -> ``PushResult``. Collective."""
        self._check_open("push_rows_many_async()")
        self._settle()
        return self._collective(lambda: self._push(rows_by_table))

    def _push(self, rows_by_table: Mapping[str, Tuple[np.ndarray, np.ndarray]]) -> PushHandle:
        """The push: header, ids and gradients posted to owners and replica holders in one
        round; ``wait`` receives, checks and applies."""
        mine, tables = self._prepared(lambda: checks.pushed(rows_by_table, self.layout.table_ids, self.layout.specs))
        count = len(self.layout.specs)
        stores = [self.store] + ([self.replica] if self.replica is not None else [])
        owners = {t: self.layout.owner_ranks(t, ids) for t, (ids, _) in tables.items()}
        empty = np.empty(0, np.int64)
        dests = [owners.get(t, empty) for t in range(count)]
        if self.replica is not None:
            dests += [self.layout.replica_ranks(owners[t]) if t in owners else empty for t in range(count)]
        sent = route(dests, self.worker_count)
        row_bytes = np.tile(self.row_bytes, len(dests) // count)
        call = self._call("push_rows_many", mine, sorted(tables))
        ids, grads = self._packed(tables, sent, row_bytes)
        sends = self._post(call, sent.counts, [(ids, np.full(len(dests), ID_BYTES, np.int64)), (grads, row_bytes)])
        handle = PushHandle(self.layout.specs, sorted(tables), self.clock_value, sent, row_bytes, sends,
                            lambda: self._receive(call, len(dests)), stores, self._collective, self._commit,
                            self._settle)
        self._pushes.append(handle)
        return handle

    def push_stacked_async(self, pulled: PullHandle, grads: np.ndarray) -> PushHandle:
        """``push_rows_many_async`` of the gradients of ``pulled``'s ids laid out as its rows
        arrived (``PullHandle.wait_stacked``: row k for ``pulled.wire_ids[k]``). The same
        messages; without replicas they leave as they are (the pull's route, no regrouping),
        else (or when they need its checks: a wrong shape or dtype, NaN or Inf) through it."""
        self._check_open("push_stacked_async()")
        if self._pushed_as_is(pulled, grads):
            self._settle()
            return self._collective(lambda: self._push_as_pulled(pulled, grads))
        route, tables = pulled.route, sorted(pulled.tables)
        if not (isinstance(grads, np.ndarray) and grads.shape[:1] == pulled.wire_ids.shape):
            grads = np.empty((len(pulled.wire_ids), 0))  # refused by the push's checks, on every rank
        natural = np.empty(len(route.order), np.int64)  # natural item -> its row in grads
        natural[route.order] = np.arange(len(route.order))
        return self.push_rows_many_async({self.layout.specs[t].name: (
            pulled.tables[t][0], grads[natural[route.offsets[t]:route.offsets[t] + len(pulled.tables[t][0])]])
            for t in tables})

    def _pushed_as_is(self, pulled: PullHandle, grads) -> bool:
        """Whether ``grads`` can leave as they are: no replicas, the pull not abandoned and made
        on this layout (not before a recovery), one
        row width and dtype over its tables, and gradients of that shape and dtype, finite."""
        if self.replica is not None or pulled.abandoned or pulled.layout is not self.layout or not pulled.tables \
                or not isinstance(grads, np.ndarray):
            return False
        first = self.layout.specs[min(pulled.tables)]
        return len({self.row_bytes[t] for t in pulled.tables}) == 1 and grads.dtype == np.dtype(first.dtype) and \
            grads.shape == pulled.wire_ids.shape + tuple(first.shape[1:]) and grads.flags.c_contiguous and \
            bool(np.isfinite(grads).all())

    def _push_as_pulled(self, pulled: PullHandle, grads: np.ndarray) -> PushHandle:
        """The push of ``push_stacked_async``'s fast case: the pull's ids and route, ``grads`` as they are."""
        tables, sent = sorted(pulled.tables), pulled.route
        call = self._call("push_rows_many", None, tables)
        sends = self._post(call, sent.counts, [(pulled.wire_ids.view(np.uint8), np.full(sent.segments, ID_BYTES)),
                                               (grads.reshape(-1).view(np.uint8), self.row_bytes)])
        handle = PushHandle(self.layout.specs, tables, self.clock_value, sent, self.row_bytes, sends,
                            lambda: self._receive(call, sent.segments), [self.store], self._collective,
                            self._commit, self._settle)
        self._pushes.append(handle)
        return handle

    def clock(self) -> int:
        """End this step (the pushes in flight are completed and applied); the new step."""
        self._check_open("clock()")
        self._settle()
        self.clock_value += 1
        return self.clock_value

    def release(self) -> None:
        """Done (collective): complete the pushes in flight and free the communicator; every
        call after it raises ``PSInputError``."""
        self._check_open("release()")
        self._settle()
        self.released = True
        release(self.comm)

    def recover(self) -> List[int]:
        """After a call raised a process failure (ULFM), on every survivor: rebuild the lost
        shards from their replicas and re-replicate (``recovery``); the lost shard keys. Then
        redo the step: pull again, push this step's gradients over the new split of the batch
        (``rank`` and ``worker_count`` changed; a step already applied is refused)."""
        self._abandon()
        return self._installed(rebuilt(self.comm, self.layout, self.key, self.store, self.replica, self.clock_value))

    def _replica_holder(self, key: int) -> Optional[int]:
        return self.layout.successor[key] if self.replica is not None else None

    def _restored_on(self, staying: MPI.Intracomm) -> List[int]:
        return self._installed(restore(staying, self.layout, self.key, self.store, self.replica, self.clock_value))

    def _installed(self, restored: Restored) -> List[int]:
        """Make a recovery's or a leave's restored shards this rank's; the keys lost."""
        release(self.comm)
        self.comm, self.layout, self.store, self.replica = restored.comm, restored.layout, restored.store, \
            restored.replica
        self.failure_agreed = False
        return restored.lost

    def save_checkpoint(self, directory: str) -> None:
        """Write every shard (ids, rows, optimizer state) and the step to ``directory`` (collective)."""
        self._check_open("save_checkpoint()")
        self._settle()
        checkpoint.save(self, directory)

    def load_checkpoint(self, directory: str) -> None:
        """Load what ``save_checkpoint`` wrote, at this or another number of ranks (collective)."""
        self._check_open("load_checkpoint()")
        self._settle()
        checkpoint.load(self, directory)

    def install(self, store: ShardStore, step: int) -> None:
        """Make ``store`` this rank's shard at ``step``, its replica made anew on the ring
        successor when replicated (collective)."""
        replica = replicate(self.comm, self.layout, self.key, store) if self.replica is not None else None
        self.store, self.replica, self.clock_value = store, replica, step

    def grown_from(self, old: Optional["ColocatedTables"]) -> None:
        """A growth (collective over every rank, the newcomers' too; these tables made ``empty``
        over them all): every row of ``old`` (this rank's tables of before, released here; None
        on a newcomer) goes to its owner under this layout with its optimizer state (and a dynamic
        table's use counters), at ``old``'s step (rank 0's: the ranks of before come first), each
        step applied at most once still; the replicas made anew."""
        if old is not None:
            old._settle()
        rows = [] if old is None else [(t, *old.store.export(t)) for t in range(len(old.layout.specs))]
        step, lazy = self.comm.bcast((old.clock_value, old.store.lazy) if self.rank == 0 else None, root=0)
        self.install(placed(self.comm, self.layout, self.key, self.optimizers, rows, step, lazy), step)
        if old is not None:
            old.release()

    # -- internals ---------------------------------------------------------------------
    def _check_open(self, call: str) -> None:
        if self.released:
            raise PSInputError(f"{call} after release(): the colocated tables take no call")

    def _prepared(self, check) -> Tuple[Optional[str], dict]:
        """This rank's checked input, or its problem (raised on every rank by ``_receive``):
        anything ``check`` raises is reported there, so no rank is left waiting."""
        try:
            return None, check()
        except PSInputError as error:
            return str(error), {}
        except Exception as error:  # e.g. not a mapping: still refused everywhere
            return f"{type(error).__name__}: {error}", {}

    def _call(self, what: str, mine: Optional[str], tables: List[int]) -> Call:
        """What every rank's header says about this call: (what, this rank's problem, signature, description)."""
        names = [self.layout.specs[t].name for t in tables]
        signature = zlib.crc32(repr((what, names)).encode()) & 0x7FFFFFFF
        return what, mine, signature, f"{what} of {names} at step {self.clock_value}"

    def _post(self, call: Call, counts: np.ndarray, parts: List[Tuple[np.ndarray, np.ndarray]]
              ) -> List[MPI.Request]:
        """Post every rank its header row and its blocks of ``parts`` ((bytes, bytes per item of
        each segment)) (``exchange.post``): one round."""
        _, mine, signature, _ = call
        headers = np.zeros((self.worker_count, HEAD + 2 * len(self.layout.specs)), np.int64)
        headers[:, :3] = int(mine is not None), signature, self.clock_value
        for i, (_, item_bytes) in enumerate(parts):
            headers[:, 3 + i] = (counts * item_bytes).sum(1)
        headers[:, HEAD:HEAD + counts.shape[1]] = counts
        return exchange.post(self.comm, headers, [items for items, _ in parts])

    def _receive(self, call: Call, segments: int) -> Tuple[np.ndarray, List[np.ndarray]]:
        """Every rank's counts for this one and its parts (rank by rank), after ``checks.refuse``
        raised on every rank if any rank's call was bad or differed."""
        what, mine, _, described = call
        headers, parts = exchange.receive(self.comm, HEAD + 2 * len(self.layout.specs))
        checks.refuse(self.comm, what, mine, headers, described)
        return headers[:, HEAD:HEAD + segments], parts

    def _gather(self, incoming: np.ndarray, asked: np.ndarray, tables: List[int]) -> np.ndarray:
        """The owner's reply to a pull: the rows of ``asked`` (ids in (source rank, table) blocks)
        in the same order, as bytes: the id blocks regrouped by table, one compiled gather per
        table, the row blocks moved back to (source, table) order."""
        ids = regroup(asked, incoming * ID_BYTES).view(np.int64)
        row_sizes = incoming * self.row_bytes
        by_table = np.empty(int(row_sizes.sum()), np.uint8)
        first_id, first_row = offsets(incoming.sum(0)), offsets(row_sizes.sum(0))
        for t in tables:
            count = int(incoming[:, t].sum())
            if count:
                rows = self.store.rows(t, ids[first_id[t]:first_id[t] + count])
                by_table[first_row[t]:first_row[t] + count * int(self.row_bytes[t])] = \
                    as_bytes(rows, int(self.row_bytes[t])).reshape(-1)
        return regroup(by_table, row_sizes, to_segments=False)

    def _packed(self, tables, sent, row_bytes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The push's ids and gradients (bytes) in (destination, segment) order: the ids by one
        gather, the gradients of every segment by one compiled move."""
        count = len(self.layout.specs)
        chosen = [tables[s % count] for s in range(sent.segments) if s % count in tables]
        if not chosen:
            return np.empty(0, np.uint8), np.empty(0, np.uint8)
        ids = np.concatenate([np.asarray(i, np.int64) for i, _ in chosen])[sent.order]
        grads = joined([np.ascontiguousarray(g).reshape(-1).view(np.uint8) for _, g in chosen])
        natural_at, wire_at, width = natural_to_wire(sent.order, sent.counts.sum(0), row_bytes)
        wire = np.empty_like(grads)
        move(grads, natural_at, wire, wire_at, width, self.unit)
        return ids.view(np.uint8), wire

    def _abandon(self) -> None:
        """Revoke the communicator and complete every request still in flight (with an error)."""
        handles = [h for h in self._pulls + self._pushes if not h.done]
        abandon(self.comm, [request for handle in handles for request in handle.requests])
        for handle in handles:
            handle.abandoned = True
        self._pulls, self._pushes = [], []

    def _settle(self, through: Optional[PushHandle] = None) -> None:
        """Complete and apply the pushes in flight in the order they were made (all, or up to
        ``through``): each receives its messages in that order."""
        while self._pushes and (through is None or not through.done):
            first = self._pushes[0]
            try:
                first.complete()
            finally:  # a failure abandoned every push in flight (``_abandon``) while it was listed
                if self._pushes and self._pushes[0] is first:
                    self._pushes.pop(0)
