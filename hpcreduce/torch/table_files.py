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
model directory keeps them).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..errors import OutputFileError, PSInputError
from ..runtime.files import write_json
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
        if rank == 0 and os.path.exists(os.path.join(directory, META)):
            os.remove(os.path.join(directory, META))  # until it is written again, the save is unfinished
        files = {c.name: np.lib.format.open_memmap(_path(directory, c.name, rank, trainers), mode="w+",
                                                   dtype=np.float32, shape=(len(range(rank, c.num_embeddings,
                                                                                      trainers)), c.embedding_dim))
                 for c in configs}
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
        except OSError as error:
            problem = str(error)
    problem = job.comm.bcast(problem, root=0)
    if problem:
        raise OutputFileError(f"save_tables into {directory}: rank 0 could not write {META}: {problem}")


class SavedTables:
    """The tables saved under ``directory``, read by id."""

    def __init__(self, directory: str):
        with open(os.path.join(directory, META)) as meta:
            saved = json.load(meta)
        self.directory, self.trainers, self.tables = directory, int(saved["trainers"]), saved["tables"]
        self._files: Dict[str, List[np.ndarray]] = {}

    def problem(self, configs: Sequence[EmbeddingBagConfig]) -> Optional[str]:
        """Why these tables cannot start ``configs`` (None when they can)."""
        wanted = {c.name: [c.num_embeddings, c.embedding_dim] for c in configs}
        if wanted != self.tables:
            return f"the saved tables {self.tables} are not the collection's {wanted} (name: [rows, dim])"
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
    except (OSError, ValueError, KeyError) as err:
        return f"tables_from={directory!r} is unreadable: {type(err).__name__}: {err}"


def _path(directory: str, table: str, rank: int, trainers: int) -> str:
    return os.path.join(directory, f"{table}.{rank}-of-{trainers}.npy")
