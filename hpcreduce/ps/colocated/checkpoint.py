"""Colocated tables on disk: one file per shard, loadable at another number of ranks.

``save(tables, directory)``: every rank writes ``shard-<key>.npz`` (each table's ids, rows and
optimizer state, a dynamic table's use counters), then rank 0 writes ``colocated.json`` (the tables,
the optimizer, the step, the shard files, and the seed of the rows made on first touch: those
never touched are not written, the seed remakes them), each file atomically. ``load(tables, directory)``:
every rank reads the description, checks it against its own tables and optimizer, reads every
``size``-th shard file and sends each row to its owner under the current layout (rendezvous
hashing over the live keys), then re-makes the replicas: any number of ranks loads any
checkpoint of the same tables. A problem (no checkpoint, other tables, a missing file) is a
``PSConfigError`` on every rank before anything is changed.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...errors import OutputFileError, PSConfigError
from ...runtime.files import atomic_file, write_json
from ...runtime.given_files import inside, open_npz, read_json, remove_regular
from .moves import Rows, placed
from .store import HEAT

DESCRIPTION = "colocated.json"
LAZY = "rows made on first touch from seed"  # the seed of the rows not written (None: every row is)


def description(tables) -> Dict[str, object]:
    """What a checkpoint of ``tables`` says about itself (shard files aside)."""
    return {"tables": [repr(spec) for spec in tables.layout.specs],
            "optimizer": [type(o).__name__ for o in tables.optimizers.values()],
            LAZY: tables.store.lazy,
            "step": tables.clock_value}


def save(tables, directory: str) -> None:
    """Write ``tables`` (collective; no push in flight)."""
    arrays: Dict[str, np.ndarray] = {}
    for t in range(len(tables.layout.specs)):
        ids, values, state = tables.store.export(t)
        arrays[f"{t}/ids"], arrays[f"{t}/values"] = ids.astype(np.int64), values
        arrays.update({f"{t}/{name}": array for name, array in state.items()})
    problem = None
    try:
        if tables.rank == 0:
            remove_regular([os.path.join(directory, DESCRIPTION)])  # until written again, the save is unfinished
        with atomic_file(os.path.join(directory, f"shard-{tables.key}.npz"), "wb") as out:
            np.savez(out, **arrays)
    except (OSError, OutputFileError) as error:
        problem = f"rank {tables.rank}: {error}"
    keys = tables.comm.allgather((tables.key, problem))
    described_last(tables.comm, os.path.join(directory, DESCRIPTION),
                   {**description(tables), "shards": sorted(k for k, _ in keys)}, [p for _, p in keys if p], "colocated")


def described_last(comm, path: str, described: Dict[str, object], problems: List[str], what: str) -> None:
    """A save's last file: rank 0 writes ``described`` to ``path`` when no rank had a problem;
    every rank learns of any problem (its peers' or rank 0's) and raises the same ``PSConfigError``."""
    if not problems and comm.Get_rank() == 0:
        try:
            write_json(path, described)
        except (OSError, OutputFileError) as error:  # every rank learns of it below: none is left waiting
            problems = [f"rank 0 ({os.path.basename(path)}): {error}"]
    problems = comm.bcast(problems, root=0)
    if problems:
        raise PSConfigError(f"{what} checkpoint not written: " + "; ".join(problems))


def load(tables, directory: str) -> None:
    """Replace ``tables``' rows, optimizer state and step with the checkpoint in ``directory``."""
    rank, size = tables.rank, tables.worker_count
    found, problem = _read(tables, directory, rank, size)
    problems = [p for p in tables.comm.allgather(problem) if p]
    if problems:
        raise PSConfigError(f"cannot load the colocated checkpoint in {directory}: {problems[0]}")
    saved, rows = found
    store = placed(tables.comm, tables.layout, tables.key, tables.optimizers, rows, int(saved["step"]), saved[LAZY])
    held = tables.comm.allreduce(np.array([len(store.tables[t].ids) for t in range(len(tables.layout.specs))]))
    short = [(spec, int(got)) for spec, got in zip(tables.layout.specs, held) if spec.dynamic is None
             and store.lazy is None and got != spec.shape[0]]
    if short:
        raise PSConfigError(f"cannot load the colocated checkpoint in {directory}: table {short[0][0].name!r} has "
                            f"{short[0][1]} rows in it, not the {short[0][0].shape[0]} it declares")
    tables.install(store, int(saved["step"]))


def _read(tables, directory: str, rank: int, size: int) -> Tuple[Optional[tuple], Optional[str]]:
    """(description, rows of this rank's share of the shard files), or the problem."""
    try:
        saved = read_json(os.path.join(directory, DESCRIPTION))
        mine = description(tables)
        for name in ("tables", "optimizer"):
            if saved.get(name) != mine[name]:
                return None, f"it holds {name} {saved.get(name)}, these tables have {mine[name]}"
        rows: List[Rows] = []
        for key in saved["shards"][rank::size]:
            with open_npz(inside(directory, f"shard-{key}.npz")) as shard:  # a key never leads outside
                for t in range(len(tables.layout.specs)):
                    state = {n: shard[f"{t}/{n}"] for n in tables.optimizers[t].state_names}
                    state.update((n, shard[f"{t}/{n}"]) for n in HEAT if f"{t}/{n}" in shard.files)
                    rows.append((t, shard[f"{t}/ids"], shard[f"{t}/values"], state))
        return (saved, rows), None
    except (OSError, ValueError, KeyError) as error:
        return None, f"{type(error).__name__}: {error}"
