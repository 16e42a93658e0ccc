"""A stop signal in ``--mode sandblaster``: the run stops between iterations, the servers
checkpoint it, every rank exits resumable; started again over the folder it goes on.

A rank that sees a stop signal tells the coordinator (one small message, at its next pass or
unit: ``StopTold.tell``); the coordinator looks after each commit (its own signal or such a
message, one ``Iprobe`` an iteration: ``wanted``) and ends the run there, as at its last
iteration. Then the primary of every slice writes ``DIR/sandblaster-slice-S/ckpt-IT.npz``: the
slice's named vectors (x and g, both buffers, the direction, the L-BFGS history) and the
coordinator's records so far (``sandblaster.record``: iteration, c, pairs, counters), atomically
(``ft.checkpoint_files``), and every rank raises ``StoppedEarly``. Started again over ``DIR``
with the same identity (model, shapes, seed, batch, method, history, l2, K servers) each
server loads the slices it keeps and every rank the records; the coordinator resumes from the
newest as after its own failure (``sandblaster_roles.coordinate``): the same iterations follow.
Workers hold nothing, so their number may change; another K or run is refused by name.
Cost with no signal: one ``Iprobe`` per iteration on the coordinator; an attribute read per
pass or unit elsewhere.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional

import numpy as np
from mpi4py import MPI

from ...errors import CheckpointMismatchError, OutputFileError, SettingProblem, setting_problem
from ...ft import checkpoint_files
from ...runtime.stop import requests, stopped_after
from ...sandblaster.placement import Placement
from ...sandblaster.record import Committed
from ...sandblaster.server import ServerState
from ..config import TrainConfig
from ..model import Model

TAG_WANTED = 7331  # any rank -> the coordinator: a stop signal came here
FOLDER = re.compile(r"^sandblaster-slice-(\d+)$")


def identity(config: TrainConfig, model: Model) -> Dict[str, object]:
    """What a sandblaster checkpoint is only valid for (not ``steps``, nor the number of workers)."""
    sandblaster = config.topology
    return {"mode": config.mode, "model": model.name,
            "parameters": {spec.name: list(spec.shape) for spec in model.param_specs()},
            "optimizer": config.optimizer, "seed": config.seed, "batch": config.batch,
            "history": sandblaster.history, "l2": sandblaster.l2, "servers": config.servers}


class StopTold:
    """This rank's part in passing a stop signal to the coordinator (rank ``coordinator`` of ``comm``)."""

    def __init__(self, comm: MPI.Intracomm, coordinator: int):
        self.comm, self.coordinator = comm, coordinator
        self.told = False

    def tell(self) -> None:
        """A server or worker: pass on a stop signal it received (once; eager, it never blocks)."""
        if requests.seen is not None and not self.told and self.comm.Get_rank() != self.coordinator:
            self.told = True
            self.comm.Send(np.ones(1, np.int64), self.coordinator, TAG_WANTED)

    def wanted(self) -> bool:
        """The coordinator, after a commit: whether a stop signal came here or to any rank."""
        found = requests.seen is not None
        while self.comm.Iprobe(MPI.ANY_SOURCE, TAG_WANTED):
            self.comm.Recv(np.zeros(1, np.int64), MPI.ANY_SOURCE, TAG_WANTED)
            found = True
        return found


def folder(directory: str, s: int) -> str:
    return os.path.join(directory, f"sandblaster-slice-{s}")


def save_stop(comm: MPI.Intracomm, config: TrainConfig, server: Optional[ServerState], placement: Placement,
              ident: Dict[str, object], iteration: int) -> None:
    """Every rank (collective): each slice's primary writes it as checkpoint ``iteration``, then
    ``StoppedEarly`` (not resumable without a folder); a file that could not be written is an
    ``OutputFileError`` on every rank."""
    directory, problem = config.fault.checkpoint_dir, None
    if server is not None and directory:
        records = {f"record.{i}": record for i, record in enumerate(server.records)}
        try:
            for s, vectors in server.slices.items():
                if placement.primary[s] == comm.Get_rank():
                    checkpoint_files.save(folder(directory, s), iteration, {"vectors": vectors.vectors, **records},
                                          {"identity": ident}, keep=config.fault.checkpoint_keep)
        except OutputFileError as err:
            problem = str(err)
    stopped_after(comm, problem, iteration, directory, unit="iteration")


def resume(comm: MPI.Intracomm, config: TrainConfig, ident: Dict[str, object],
           server: Optional[ServerState]) -> List[np.ndarray]:
    """Collective: the records of the newest complete checkpoint in ``--checkpoint-dir`` (empty:
    none), the slices this rank keeps (``server``) loaded from it; ``CheckpointMismatchError``
    on every rank for another run's folder."""
    directory = config.fault.checkpoint_dir
    found = _latest(directory, ident, config.servers) if comm.Get_rank() == 0 and directory else None
    found = comm.bcast(found, root=0)
    if isinstance(found, SettingProblem):
        raise CheckpointMismatchError(found)
    if found is None:
        return []
    records: List[np.ndarray] = []
    for s, vectors in (server.slices.items() if server else ()):
        _metadata, arrays = checkpoint_files.read(checkpoint_files.path_for(folder(directory, s), found))
        np.copyto(vectors.vectors, arrays["vectors"])
        records = [arrays[f"record.{i}"] for i in range(sum(name.startswith("record.") for name in arrays))]
    records = comm.bcast(records, root=0)  # rank 0 is a server at the start
    if server is not None:
        server.records = list(records)
    return records


def _latest(directory: str, ident: Dict[str, object], servers: int):
    """Rank 0: the newest iteration every slice's file reads back whole, None, or why the folder
    cannot be resumed (another run's, another K, other files)."""
    if not os.path.isdir(directory):
        return None
    slices = sorted(int(m.group(1)) for m in map(FOLDER.match, os.listdir(directory)) if m)
    others = [name for name in os.listdir(directory) if not FOLDER.match(name) and not name.startswith(".")]
    if others or (slices and slices != list(range(servers))):
        return setting_problem("{checkpoint_dir} {path} holds {what}, not this sandblaster run's checkpoint of "
                               "{count} slice(s) ({servers} {count}); give another folder or empty it",
                               path=directory, count=servers,
                               what=f"{others[0]!r}" if others else f"checkpoints of {len(slices)} slice(s)")
    iterations = [dict(checkpoint_files.checkpoints(folder(directory, s))) for s in slices]
    for iteration in sorted(set.intersection(*map(set, iterations)) if iterations else (), reverse=True):
        read = [checkpoint_files.read_or_warn(found[iteration], checkpoint_files.print_warning, arrays=False)
                for found in iterations]
        if all(read):
            problem = checkpoint_files.identity_problem(read[0][0], ident)
            if problem:
                return setting_problem("{checkpoint_dir} {path}: its checkpoint of iteration {iteration} {why}; give "
                                       "another folder or empty it", path=directory, iteration=iteration, why=problem)
            return iteration
    return None


def resumed_line(records: List[np.ndarray], workers: int) -> str:
    newest = Committed.from_array(records[-1])
    return f"resumed from the checkpoint of iteration {newest.iteration} (now {workers} worker(s))"
