"""Table-wise tables on disk (one file per table, loadable at any number of ranks), and moved
whole to more ranks at a growth.

``save(tables, directory)``: each owner writes ``table-<t>.npz`` (its rows and optimizer state),
then rank 0 writes ``tablewise.json`` (the tables, the optimizer, the step), each file
atomically. ``load(tables, directory)``: every rank checks the description against its own
tables and optimizer and reads the files of the tables it owns now (whole tables: any number
of ranks reads any checkpoint of the same tables), then the replicas are re-made. A problem (no
checkpoint, other tables, a missing file) is a ``PSConfigError`` on every rank before anything
is changed. ``grown``: the tables of before a growth each sent whole to its owner over more
ranks; both end in ``install``.
"""
from __future__ import annotations

import os
from typing import Dict, List, Tuple

import numpy as np

from ...errors import OutputFileError, PSConfigError
from ...runtime.files import atomic_file
from ...runtime.given_files import open_npz, read_json, remove_regular
from .checkpoint import described_last
from .tablewise_ft import replicate

DESCRIPTION = "tablewise.json"


def description(tables) -> Dict[str, object]:
    return {"tables": [repr(spec) for spec in tables.specs], "optimizer": type(tables.optimizer).__name__,
            "step": tables.clock_value}


def save(tables, directory: str) -> None:
    """Write ``tables`` (collective; no push in flight)."""
    problem = None
    try:
        os.makedirs(directory, exist_ok=True)
        if tables.rank == 0:
            remove_regular([os.path.join(directory, DESCRIPTION)])  # until written again, the save is unfinished
        for t in tables.mine:
            with atomic_file(os.path.join(directory, f"table-{t}.npz"), "wb") as out:
                np.savez(out, values=tables.values[t], **{f"state_{n}": a for n, a in tables.state[t].items()})
    except (OSError, OutputFileError) as error:
        problem = f"rank {tables.rank}: {error}"
    described_last(tables.comm, os.path.join(directory, DESCRIPTION), description(tables),
                   [p for p in tables.comm.allgather(problem) if p], "table-wise")


def load(tables, directory: str) -> None:
    """Replace ``tables``' rows, optimizer state and step with the checkpoint in ``directory``."""
    found, problem, saved = {}, None, {}
    try:
        saved = read_json(os.path.join(directory, DESCRIPTION))
        mine = description(tables)
        problem = next((f"it holds {name} {saved.get(name)}, these tables have {mine[name]}"
                        for name in ("tables", "optimizer") if saved.get(name) != mine[name]), None)
        for t in tables.mine if problem is None else ():
            with open_npz(os.path.join(directory, f"table-{t}.npz")) as table:
                found[t] = (np.ascontiguousarray(table["values"]),
                            {n: np.ascontiguousarray(table[f"state_{n}"]) for n in tables.optimizer.state_names})
    except (OSError, ValueError, KeyError) as error:
        problem = f"{type(error).__name__}: {error}"
    problems = [p for p in tables.comm.allgather(problem) if p]
    if problems:
        raise PSConfigError(f"cannot load the table-wise checkpoint in {directory}: {problems[0]}")
    install(tables, found, int(saved["step"]))


def grown(tables, old) -> None:
    """A growth (collective over every rank, the newcomers' too): each table of ``old`` (this
    rank's tables of before, released here; None on a newcomer) sent whole to its owner in
    ``tables`` (made ``empty`` over every rank) and installed at ``old``'s step (rank 0's: the
    ranks of before come first)."""
    outgoing: List[List[tuple]] = [[] for _ in range(tables.worker_count)]
    if old is not None:
        old._collective(old._settle)
        old.touch.make_all()  # tables travel whole
        for t in old.mine:
            outgoing[int(tables.owner[t])].append((t, old.values[t], old.state[t]))
    found = {t: (values, state) for pieces in tables.comm.alltoall(outgoing) for t, values, state in pieces}
    install(tables, found, tables.comm.bcast(old.clock_value if tables.rank == 0 else None, root=0))
    if old is not None:
        old.release()


def install(tables, found: Dict[int, Tuple[np.ndarray, Dict[str, np.ndarray]]], step: int) -> None:
    """``found`` (this rank's tables now: rows and optimizer state, whole) made its own at
    ``step``, each step applied at most once still; the replicas made anew (collective)."""
    tables.values = {t: values for t, (values, _) in found.items()}
    tables.state = {t: state for t, (_, state) in found.items()}
    tables.last_step, tables.clock_value = {t: step - 1 for t in found}, step
    tables.touch.forget()
    tables._forward = None
    if tables._replicated:
        tables._install(replicate(tables.comm, tables.successor, tables.predecessor,
                                  {t: (values, state, step - 1) for t, (values, state) in found.items()}))
