"""Checkpoints of the workers' dense replica in ``--mode hybrid`` without ``--ft``.

The servers checkpoint the sparse tables (``shard_checkpoints``); the dense parameters and their
optimizer state live on the workers, identical on each, so the first worker writes them, at the
same steps, to ``DIR/dense-replica/ckpt-STEP.npz`` (atomically, the newest ``keep`` kept). A
hybrid checkpoint is complete only with that file (``shard_checkpoints.latest_complete``). On a
resume the first worker loads it into its replica; ``DenseReplica.join`` then gives it to the
other workers (the replica with the most steps applied is broadcast).
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from ...ft import checkpoint_files
from .dense_replica import DenseReplica
from .shard_checkpoints import DENSE



def folder(directory: str) -> str:
    return os.path.join(directory, DENSE)


def save_dense(directory: str, step: int, replica: DenseReplica, identity: Mapping[str, object],
               keep: int) -> str:
    """Write ``replica`` (``step`` steps applied) as dense checkpoint ``step``."""
    arrays = {f"param.{name}": value for name, value in replica.params.items()}
    arrays.update({f"state.{name}.{key}": value for name, state in replica.state.items()
                   for key, value in state.items()})
    return checkpoint_files.save(folder(directory), step, arrays, {"identity": dict(identity)}, keep=keep)


def load_dense(directory: str, step: int, replica: DenseReplica) -> None:
    """``replica`` as dense checkpoint ``step`` holds it (``step`` steps applied)."""
    _metadata, arrays = checkpoint_files.read(checkpoint_files.path_for(folder(directory), step))
    for name, value in replica.params.items():
        np.copyto(value, arrays[f"param.{name}"])
    for name, state in replica.state.items():
        for key, value in state.items():
            np.copyto(value, arrays[f"state.{name}.{key}"])
    replica.applied = step


def save_when_due(directory: str, step: int, replica: DenseReplica, worker_index: int,
                  every: int, after: int, identity: Mapping[str, object], keep: int) -> None:
    """The first worker (``worker_index`` 0), at the start of step ``step`` (from 1): the replica
    written as checkpoint ``step - 1`` when the servers checkpoint that step (every ``every``
    steps, past ``after``: the step resumed from)."""
    done = step - 1
    if worker_index == 0 and every and directory and done > after and done % every == 0:
        save_dense(directory, done, replica, identity, keep)


def saved(directory: str, step: int) -> bool:
    """Whether dense checkpoint ``step`` exists."""
    return os.path.exists(checkpoint_files.path_for(folder(directory), step))
