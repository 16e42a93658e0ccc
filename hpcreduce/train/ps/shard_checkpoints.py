"""Checkpoints of parameter-server shards, and restoring a shard from them.

Each server writes its own shard to ``DIR/ps-shard-KEY/ckpt-STEP.npz`` (atomically, the
newest ``checkpoint_keep`` kept: ``ft.checkpoint_files.save``) when the slowest worker's
clock reaches a multiple of ``checkpoint_every``: the values and optimizer state of its pieces, their exactly-once
bookkeeping and the shard's push counters. Under BSP a checkpoint of step C holds
exactly the steps below C (gradients buffered for step C are left out, and with them
the record of their pushes), so the shards written at C form one consistent state.
Checkpoint C is *complete* when every shard of the placement it was written under has
written it. A shard lost together with its replica (K = 1, or two neighbours on the
ring) is rebuilt from the latest complete checkpoint, whatever the placement is now:
every file is cut along the current placement (``ps.fragments``) and the lost
shard's ranges are assembled. A checkpoint that does not read back whole is passed
over (with a warning) for the previous complete one. Checkpoints carry the identity of
their run (``train.identity``): ``refuse_foreign`` refuses, before training, a folder
holding another run's. Cost: the shard's bytes to disk every checkpoint; a restore
reads every file of one checkpoint (finding the latest complete one checks their checksums,
streaming). A ``ps-shard-KEY`` or dense-replica folder that is a symlink is never followed.
Without ULFM a relaunched job resumes from them (``fallback``): each server builds its shard
with ``restore_shard`` (one saved shard in memory at a time), and checkpoints newer than the
one resumed from (never complete, or unreadable) are removed first (``remove_newer``), so the
files of one step are always written by one launch, under one placement.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ...errors import CheckpointMismatchError, SettingProblem, setting_problem
from ...ft import checkpoint_files
from ...runtime.files import remove_stale_temporaries
from ...runtime.given_files import open_npz, real_folder, remove_regular
from ...ps.dynamic_rows import DynamicTable
from ...ps.fragments import Fragment, assemble, cut
from ...ps.optimizers import Optimizer
from ...ps.placement import Placement
from ...ps.shard_state import COUNTERS, ShardState, TableShard
from ...ps.tables import ParamSpec

FOLDER = re.compile(r"^ps-shard-(\d+)$")
DENSE = "dense-replica"  # hybrid's dense replica (``dense_checkpoints``)


def folder(directory: str, key: int) -> str:
    return os.path.join(directory, f"ps-shard-{key}")


def save_shard(directory: str, step: int, state: ShardState, keys: Sequence[int], bsp: bool, *,
               identity: Mapping[str, object], keep: int = 2, halfway: Callable[[], None] = lambda: None) -> str:
    """Write shard ``state`` as checkpoint ``step`` (``keys``: the shards of the placement;
    ``identity``: the run's), keeping the newest ``keep``."""
    arrays: Dict[str, np.ndarray] = {}
    tables = {}
    for t, table in state.tables.items():
        last_push = np.minimum(table.last_push, step - 1) if bsp else table.last_push
        arrays.update({f"t{t}.values": table.values, f"t{t}.last_push": last_push,
                       f"t{t}.read_version": table.read_version})
        arrays.update({f"t{t}.optimizer.{name}": array for name, array in table.optimizer_state.items()})
        if table.sparse:
            arrays[f"t{t}.ids"] = table.ids
        if table.dynamic:
            arrays[f"t{t}.last_used"], arrays[f"t{t}.uses"] = table.heat(slice(None))
            if table.sketch is not None:
                arrays[f"t{t}.sketch"] = table.sketch
        tables[str(t)] = {"sparse": table.sparse, "start": table.start, "version": table.version,
                          "dynamic": table.dynamic}
    arrays.update({name: getattr(state, name) for name in COUNTERS})
    metadata = {"key": state.shard, "keys": sorted(int(k) for k in keys), "slot_count": state.slot_count,
                "applied_steps": min(state.applied_steps, step) if bsp else state.applied_steps,
                "tables": tables, "refusals": dict(state.refusals),
                "read_staleness": _plain(state.read_staleness), "update_lag": _plain(state.update_lag),
                "row_events": dict(state.row_events), "identity": dict(identity)}
    return checkpoint_files.save(folder(directory, state.shard), step, arrays, metadata, keep=keep, halfway=halfway)


def _plain(histogram: Counter) -> Dict[str, int]:
    return {str(k): int(v) for k, v in histogram.items()}


def _shard_files(directory: Optional[str]) -> Dict[int, Dict[int, str]]:
    """Per step, per shard key: the checkpoint files in ``directory``."""
    steps: Dict[int, Dict[int, str]] = {}
    if directory and os.path.isdir(directory):
        for name in os.listdir(directory):
            match = FOLDER.match(name)
            if match and real_folder(os.path.join(directory, name)):  # a link there is never followed
                for step, path in checkpoint_files.checkpoints(os.path.join(directory, name)):
                    steps.setdefault(step, {})[int(match.group(1))] = path
    return steps


def step_files(directory: str, step: int) -> List[str]:
    """The files of checkpoint ``step`` in ``directory``, one per shard that wrote it."""
    return sorted(_shard_files(directory).get(step, {}).values())


def latest_complete(directory: Optional[str], warn: checkpoint_files.Warn = checkpoint_files.print_warning) -> Optional[int]:
    """The newest step every shard of its placement wrote a checkpoint of that reads back
    whole (in hybrid, the dense replica's too), or None; ``warn`` names each file passed over.
    Every entry's checksum is checked streaming: no shard is held in memory."""
    steps = _shard_files(directory)
    dense = os.path.join(directory, DENSE) if directory else ""
    for step in sorted(steps, reverse=True):
        paths = list(steps[step].values())
        if real_folder(dense):  # hybrid: the workers' dense replica too (``dense_checkpoints``)
            paths.append(checkpoint_files.path_for(dense, step))
        read = [checkpoint_files.read_or_warn(path, warn, arrays=False, verify=True) if os.path.exists(path)
                else None for path in paths]
        if all(read) and set(read[0][0]["keys"]) <= set(steps[step]):
            return step
    return None


def refuse_foreign(comm, directory: Optional[str], identity: Mapping[str, object]) -> None:
    """Raise ``CheckpointMismatchError`` on every rank of ``comm`` if a checkpoint in
    ``directory`` was written by a run other than ``identity``'s, as rank 0 reads the folder
    (unreadable files are left to ``latest_complete``); rank 0 also removes the temporaries
    of writers that died. Collective: one small broadcast."""
    problem = comm.bcast(foreign_problem(directory, identity) if comm.Get_rank() == 0 else None, root=0)
    if problem is not None:
        raise CheckpointMismatchError(problem)


def foreign_problem(directory: Optional[str], identity: Mapping[str, object]) -> Optional[SettingProblem]:
    """Why ``directory`` holds another run's checkpoint, by this rank's reading, or None;
    removes the temporaries of writers that died."""
    if not (directory and os.path.isdir(directory)):
        return None
    for step, files in sorted(_shard_files(directory).items()):
        for path in files.values():
            found = checkpoint_files.read_or_warn(path, lambda _text: None, arrays=False)
            problem = found and checkpoint_files.identity_problem(found[0], identity)
            if problem:
                return setting_problem(
                    "{checkpoint_dir} {path}: its checkpoint of step {step} {why}; give another folder or empty it",
                    path=directory, step=step, why=problem)
    for name in os.listdir(directory):
        if FOLDER.match(name):
            remove_stale_temporaries(os.path.join(directory, name))
    return None


def step_metadata(directory: str, step: int) -> Dict[str, object]:
    """The metadata of checkpoint ``step`` (one of its files): ``keys``, ``slot_count``..."""
    return checkpoint_files.read(_path(directory, None, step), arrays=False)[0]


def remove_newer(directory: str, step: int) -> List[str]:
    """Remove every shard (and dense replica) checkpoint of a step above ``step``; returns their paths."""
    removed = [path for later, files in _shard_files(directory).items() if later > step for path in files.values()]
    dense = os.path.join(directory, DENSE)
    removed += [path for later, path in checkpoint_files.checkpoints(dense) if later > step] if real_folder(dense) else []
    return remove_regular(removed)


def restore_shard(directory: str, step: int, key: int, specs: Sequence[ParamSpec], placement: Placement,
                  optimizers: Mapping[int, Optimizer], slot_count: int) -> ShardState:
    """Shard ``key`` of ``placement`` as checkpoint ``step`` holds it (no counters), reading
    the saved shards one at a time and keeping only their fragments of ``key``. With no shard
    key added since, sparse rows stay with their key (rendezvous hashing): no rows are hashed."""
    fragments, applied = [], 0
    keys = step_metadata(directory, step)["keys"]
    stay = set(placement.shards) <= set(keys)
    for saved_key in keys:
        saved = _load(_path(directory, saved_key, step), specs, optimizers)
        fragments += [_copied(f) for f in cut(saved, placement, rows_stay=stay).get(key, [])]
        applied = max(applied, saved.applied_steps)
    return ShardState.empty(key, assemble(key, specs, placement, fragments, optimizers, slot_count), slot_count,
                            applied)


def _copied(fragment: Fragment) -> Fragment:
    """``fragment`` with its own arrays (not views keeping a whole saved shard alive)."""
    return dataclasses.replace(fragment, values=fragment.values.copy(),
                               optimizer_state={n: a.copy() for n, a in fragment.optimizer_state.items()})


def saved_last_pushes(directory: str, step: int) -> Dict[int, Dict[int, np.ndarray]]:
    """``last_pushes`` of checkpoint ``step``, reading only those arrays."""
    record: Dict[int, Dict[int, np.ndarray]] = {}
    for key in step_metadata(directory, step)["keys"]:
        with open_npz(_path(directory, key, step)) as stored:
            tables = checkpoint_files.metadata_of(stored)["tables"]
            record[key] = {int(t): stored[f"t{t}.last_push"] for t in tables}
    return record


def load_states(directory: str, step: int, specs: Sequence[ParamSpec],
                optimizers: Mapping[int, Optimizer]) -> List[ShardState]:
    """Every shard state written as checkpoint ``step`` (counters included)."""
    metadata, _ = checkpoint_files.read(_path(directory, None, step), arrays=False)
    return [_load(_path(directory, key, step), specs, optimizers) for key in metadata["keys"]]


def _path(directory: str, key: Optional[int], step: int) -> str:
    if key is None:
        for name in sorted(os.listdir(directory)):
            path = checkpoint_files.path_for(os.path.join(directory, name), step)
            if FOLDER.match(name) and real_folder(os.path.join(directory, name)) and os.path.exists(path):
                return path
        raise FileNotFoundError(f"no parameter-server checkpoint of step {step} in {directory}")
    return checkpoint_files.path_for(folder(directory, key), step)


def _load(path: str, specs: Sequence[ParamSpec], optimizers: Mapping[int, Optimizer]) -> ShardState:
    with open_npz(path) as stored:
        metadata = checkpoint_files.metadata_of(stored)
        slot_count = int(metadata["slot_count"])
        tables = {}
        for name, info in metadata["tables"].items():
            t = int(name)
            if bool(info.get("dynamic")) != (specs[t].dynamic is not None):
                raise CheckpointMismatchError(
                    f"{path}: table {specs[t].name!r} was saved {'dynamic' if info.get('dynamic') else 'fixed'} "
                    f"and this run declares it {'dynamic' if specs[t].dynamic else 'fixed'}; nothing was restored")
            state_arrays = {key: stored[f"t{t}.optimizer.{key}"] for key in optimizers[t].state_names}
            if info.get("dynamic"):
                table = DynamicTable(t, specs[t], optimizers[t], slot_count)
                table.take(stored[f"t{t}.ids"], stored[f"t{t}.values"], state_arrays,
                           stored[f"t{t}.last_used"], stored[f"t{t}.uses"])
                if table.sketch is not None:
                    table.sketch = stored[f"t{t}.sketch"]
                table.version = info["version"]
                table.last_push, table.read_version = stored[f"t{t}.last_push"], stored[f"t{t}.read_version"]
            else:
                table = TableShard(t, info["sparse"], stored[f"t{t}.values"], state_arrays,
                                   slot_count, start=info["start"], version=info["version"],
                                   last_push=stored[f"t{t}.last_push"], read_version=stored[f"t{t}.read_version"])
                if table.sparse:
                    table.own_rows(stored[f"t{t}.ids"], specs[t].shape[0])
            tables[t] = table
        state = ShardState.empty(int(metadata["key"]), tables, slot_count, int(metadata["applied_steps"]))
        for name in COUNTERS:
            getattr(state, name)[:] = stored[name]
    state.refusals.update(metadata["refusals"])
    state.read_staleness.update({int(k): v for k, v in metadata["read_staleness"].items()})
    state.update_lag.update({int(k): v for k, v in metadata["update_lag"].items()})
    state.row_events.update(metadata.get("row_events", {}))
    return state


def restore(saved: List[ShardState], key: int, specs: Sequence[ParamSpec], placement: Placement,
            optimizers: Mapping[int, Optimizer], slot_count: int, counted: Sequence[int]) -> ShardState:
    """Shard ``key`` of ``placement`` as it was in the checkpoint ``saved``, with the
    counters of the saved shards whose keys are in ``counted``."""
    fragments = [f for state in saved for f in cut(state, placement).get(key, [])]
    restored = ShardState.empty(key, assemble(key, specs, placement, fragments, optimizers, slot_count),
                                slot_count, max(state.applied_steps for state in saved))
    restored.merge_counters([state for state in saved if state.shard in counted])
    return restored


def last_pushes(saved: List[ShardState]) -> Dict[int, Dict[int, np.ndarray]]:
    """Per saved shard key and table: the last step each worker slot had pushed to it."""
    return {state.shard: {t: table.last_push for t, table in state.tables.items()} for state in saved}

