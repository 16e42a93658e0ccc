"""What each rank of a Sandblaster run does in its role, over the model being trained.

``initial_slices``: a server's slices of the flat parameter vector (``sandblaster.placement``),
from the model's initial values; ``coordinate``: the coordinator runs the batch method
(``sandblaster.lbfgs``) over the servers and workers, resuming from the newest record the
servers hold; ``work``: a worker computes work units of the fixed batch; ``gather``: the
committed x and g, whole, on every rank. The run around them (failures, roles after a loss):
``run``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Sequence

import numpy as np
from mpi4py import MPI

from ...runtime.context import Traffic
from ...sandblaster import Roles
from ...sandblaster.coordinator import Coordinator
from ...sandblaster.lbfgs import BatchOptimizer, Iteration, Settings
from ...sandblaster.placement import Placement
from ...sandblaster.protocol import VectorNames
from ...sandblaster.record import Committed
from ...sandblaster.server import ServerState, SliceVectors
from ...sandblaster.worker import Worker
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model
from ..partition import global_batch
from ..straggler import factor_for
from .flat import FlatParams
from .units import ModelUnits


def initial_slices(flat: FlatParams, model: Model, config: TrainConfig, placement: Placement,
                   rank: int) -> ServerState:
    """Server ``rank``'s slices (and replicas) of the model's initial parameters."""
    initial = flat.flatten(model.init_params(config.seed))
    return ServerState({s: SliceVectors(VectorNames(config.topology.history), initial[lo:hi])
                        for s in placement.held_by(rank) for lo, hi in [placement.bounds[s]]})


def work(comm: MPI.Intracomm, roles: Roles, placement: Placement, flat: FlatParams, model: Model, dataset: Dataset,
         config: TrainConfig, unit: int, me: int, traffic: Traffic, on_unit: Callable[[int], None]) -> Worker:
    """A worker (stable id ``me``) computing units of ``unit`` examples of the fixed batch; returned
    once ``run`` started (its ``pending`` are abandoned after a failure)."""
    indices = global_batch(0, config.batch, dataset.size("train"), config.seed)
    compute = ModelUnits(model, dataset, flat, indices, unit, factor_for(config.fault, me))
    return Worker(comm, roles.coordinator, placement.for_workers(), flat.length, compute,
                  config.topology.push_units, traffic, on_unit=on_unit)


def coordinate(comm: MPI.Intracomm, roles: Roles, config: TrainConfig, unit: int, records: List[np.ndarray],
               done: int, log: Callable[[Iteration], None], ids: Sequence[int], traffic: Traffic,
               on_begin: Callable[[int], None], stop_wanted: Callable[[], bool]) -> Dict[str, Any]:
    """Run the batch method to its end, or to the commit where ``stop_wanted()``, from the newest
    of ``records`` (the iterations past ``done`` that a dead coordinator, or the launch before a
    resume, did are logged first); returns c, ``stopped`` (early, by a stop) and the run's counters."""
    sandblaster = config.topology
    coordinator = Coordinator(comm, range(roles.servers), roles.workers, math.ceil(config.batch / unit),
                              sandblaster.backups, traffic, on_begin=on_begin)
    for record in map(Committed.from_array, records):
        if record.iteration > done:  # iterations a dead coordinator did
            count = max(record.stats[2], 1.0)
            log(Iteration(record.iteration, record.f, record.stats[1] / count, math.sqrt(record.gg),
                          record.step, record.evaluations))
    optimizer = BatchOptimizer(coordinator, Settings(config.optimizer, sandblaster.history, sandblaster.gtol,
                                                     sandblaster.ftol, config.steps, config.batch, sandblaster.l2),
                               log, resume=Committed.from_array(records[-1]) if records else None,
                               stop_wanted=stop_wanted)
    final = optimizer.run()
    coordinator.stop()
    return {"c": optimizer.c, "stopped": optimizer.stopped_early, "summary": {
        "units": coordinator.counted, "backups_issued": coordinator.backups_issued,
        "duplicates_discarded": coordinator.duplicates, "iterations": optimizer.iterations,
        "evaluations": coordinator.passes, "pass_s": coordinator.pass_s,
        "units_by_worker": {str(ids[w]): n for w, n in coordinator.units_by_worker.items()},
        "units_per_pass": coordinator.units, "optimizer": config.optimizer, "history": sandblaster.history,
        "unit": unit, "backups": sandblaster.backups, "stopped_by": optimizer.stopped_by,
        "final_gradient_norm": math.sqrt(final.gg), "objective": final.f}}


def gather(comm: MPI.Intracomm, server: ServerState, placement: Placement, length: int, c: int) -> List[np.ndarray]:
    """The committed x[c] and g[c], whole, on every rank (each served slice from its primary)."""
    names, me = VectorNames(1), comm.Get_rank()
    found = []
    for ids in (names.X, names.G):
        whole = np.zeros(length)
        for s, vectors in (server.slices.items() if server else ()):
            if placement.primary[s] == me:
                lo, hi = placement.bounds[s]
                whole[lo:hi] = vectors.vectors[ids[c]]
        comm.Allreduce(MPI.IN_PLACE, whole, op=MPI.SUM)
        found.append(whole)
    return found
