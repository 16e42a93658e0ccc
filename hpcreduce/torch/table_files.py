"""A collection's fixed tables saved sharded by the trainers and loaded at any number of servers
or trainers (resharding by id).

    job.clock()                                           # the step's pushes applied
    save_tables(job, "ckpt/tables")                       # every trainer: its share of every table
    ...
    job = start_hybrid(model, sparse_optimizer=..., servers=3, tables_from="ckpt/tables")

``save_tables``: trainer r of T writes ids r, r + T, r + 2T, ... of each table (pulled a
``CHUNK`` of rows at a time, the same number of pulls on every trainer, as colocated tables
need) to ``{table}.{r}-of-{T}.npy``; trainer 0 writes ``tables.json`` (each table's rows and
dim, T) last, so a directory without it is an unfinished save. ``SavedTables.rows(table,
ids)``: id i is row i // T of file i % T (memory-mapped): any layout reads the same table.
Dynamic tables are not saved (their rows exist only on the servers: ``hpcreduce.train``'s
model directory keeps them). ``saved_problem`` checks the whole folder (``tables.json`` and the
header and length of every file) on every rank before anything starts, in either sharding, so a
missing or cut file is refused at start on every rank, never met by one table owner in a pull.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import OutputFileError, PSInputError
from ..runtime.environment import MAX_RANKS
from ..runtime.files import refuse_foreign_link, write_json
from ..runtime.given_files import inside, nbytes, npy_file_header, read_json, remove_regular
from ..runtime.watchdog import watchdog
from .embedding_configs import EmbeddingBagConfig

CHUNK = 1 << 18
META = "tables.json"


def save_tables(job, directory: str) -> None:
    """Write ``job``'s (a ``HybridWorker``) fixed tables under ``directory`` (collective over the
    trainers; call it between steps, after ``clock()``)."""
    configs = job.collection.embedding_bag_configs()
    dynamic = [c.name for c in configs if c.num_embeddings is None]
    if dynamic:
        raise PSInputError(f"save_tables: tables {dynamic} are dynamic; only fixed tables are saved here")
    rank, trainers = job.comm.Get_rank(), job.comm.Get_size()
    problem = None
    try:  # a folder or file one rank cannot write is agreed, so no rank waits in the pulls below
        os.makedirs(directory, exist_ok=True)
        if rank == 0:
            remove_regular([os.path.join(directory, META)])  # until it is written again, the save is unfinished
        files = {c.name: _written(_path(directory, c.name, rank, trainers),
                                  (len(range(rank, c.num_embeddings, trainers)), c.embedding_dim)) for c in configs}
    except OSError as error:
        problem = f"rank {rank}: {error}"
    problems = [p for p in job.comm.allgather(problem) if p]
    if problems:
        raise OutputFileError(f"save_tables into {directory}: " + "; ".join(problems))
    most = max(-(-c.num_embeddings // trainers) for c in configs)
    for begin in range(0, most, CHUNK):
        ids = {c.name: np.arange(rank + begin * trainers, c.num_embeddings, trainers, dtype=np.int64)[:CHUNK]
               for c in configs}
        for name, rows in job.store.pull_rows_many_async(ids).wait().items():
            files[name][begin:begin + len(rows)] = rows
    for out in files.values():
        out.flush()
    with watchdog.guard("save_tables: every trainer's shard files written"):
        job.comm.Barrier()  # every shard file written before the description that completes the save
    problem = None
    if rank == 0:
        meta = {"trainers": trainers, "tables": {c.name: [c.num_embeddings, c.embedding_dim] for c in configs}}
        try:
            write_json(os.path.join(directory, META), meta)
        except (OSError, OutputFileError) as error:
            problem = str(error)
    problem = job.comm.bcast(problem, root=0)
    if problem:
        raise OutputFileError(f"save_tables into {directory}: rank 0 could not write {META}: {problem}")


class SavedTables:
    """The tables saved under ``directory``, read by id."""

    def __init__(self, directory: str):
        saved = read_json(os.path.join(directory, META))
        self.directory, self.trainers, self.tables = directory, int(saved["trainers"]), saved["tables"]
        if not 1 <= self.trainers <= MAX_RANKS:
            raise ValueError(f"{META} says {self.trainers} trainers wrote it")
        self._files: Dict[str, List[np.ndarray]] = {}

    def problem(self, configs: Sequence[EmbeddingBagConfig]) -> Optional[str]:
        """Why these tables cannot start ``configs`` (None when they can): other tables, or a
        file of theirs missing, cut or of another shape (every file's header read)."""
        wanted = {c.name: [c.num_embeddings, c.embedding_dim] for c in configs}
        if wanted != self.tables:
            return f"the saved tables {self.tables} are not the collection's {wanted} (name: [rows, dim])"
        for name, (rows, dim) in sorted(wanted.items()):
            for r in range(self.trainers):
                path = _path(self.directory, name, r, self.trainers)
                shape, dtype, there = npy_file_header(path)
                expected = (len(range(r, rows, self.trainers)), dim)
                if shape != expected or dtype != np.float32 or there < nbytes(shape, dtype):
                    return (f"{os.path.basename(path)} holds {dtype} {list(shape)} in {there} data bytes; "
                            f"float32 {list(expected)} was saved (cut or replaced since)")
        return None

    def rows(self, table: str, ids: np.ndarray) -> np.ndarray:
        files = self._files.get(table)
        if files is None:
            files = self._files[table] = [np.load(_path(self.directory, table, r, self.trainers), mmap_mode="r")
                                          for r in range(self.trainers)]
        out = np.empty((len(ids), files[0].shape[1]), np.float32)
        owner = ids % self.trainers
        for r, values in enumerate(files):
            mine = owner == r
            out[mine] = values[ids[mine] // self.trainers]
        return out


def saved_problem(directory: Optional[str], configs: Sequence[EmbeddingBagConfig]) -> Optional[str]:
    """Why ``directory`` cannot start ``configs`` (None when it can, or when it is None)."""
    if directory is None:
        return None
    if not os.path.exists(os.path.join(directory, META)):
        return f"tables_from={directory!r} holds no finished save_tables ({META} is missing)"
    try:
        return SavedTables(directory).problem(configs)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"tables_from={directory!r} is unreadable: {type(err).__name__}: {err}"


def _written(path: str, shape: Tuple[int, int]) -> np.ndarray:
    """A new float32 ``.npy`` file at ``path`` mapped to be written in place (never through
    another user's symlink: ``runtime.files``)."""
    refuse_foreign_link(path)
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)


def _path(directory: str, table: str, rank: int, trainers: int) -> str:
    return inside(directory, f"{table}.{rank}-of-{trainers}.npy")
