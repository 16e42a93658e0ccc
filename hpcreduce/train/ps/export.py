"""A PS model written sharded, and a whole model assembled from shards only when asked.

``save_model`` (collective, at the end of ``hpcreduce train --mode ps --model-dir DIR``):
every server writes its own shard, in parallel, to ``DIR/shard-KEY.npz`` (each table's
values, optimizer state, and its row ids or element offset), atomically; rank 0 then
writes ``DIR/manifest.json`` last, atomically, once every shard is on disk: the run's
identity (``train.identity``: model, shapes, optimizer...), the step and the shard files.
In ``--mode hybrid`` the servers' shards hold the sparse tables (the identity's ``server
tables``, in their order) and rank 0 writes the workers' dense parameters to ``DIR/dense.npz``
(values only, no optimizer state), named in the manifest's ``dense``.
A folder without a manifest (a run that died while writing) is never taken for a model.

``whole_model`` (``hpcreduce export``, one process) assembles every table whole from
such a folder, or from a checkpoint folder (``--checkpoint-dir``: the latest complete
checkpoint, whatever K wrote it), and ``write_whole`` writes it as one ``.npz``.
Cost: each server writes its bytes once; an export reads every shard once and holds the
whole model (that is what it is for).
"""
from __future__ import annotations

import io
import os
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import CheckpointMismatchError, HpcreduceError, InputFileError, OutputFileError
from ...ft import checkpoint_files
from ...ps.layout import Layout
from ...ps.shard_state import ShardState
from ...runtime.files import atomic_file, write_json, written_through
from ...runtime.given_files import inside, open_npz, read_json, remove_regular
from . import shard_checkpoints

MANIFEST = "manifest.json"
DENSE = "dense.npz"
FORMAT = "hpcreduce-ps-model/1"


def shard_name(key: int) -> str:
    return f"shard-{key}.npz"


def shard_arrays(state: ShardState) -> Dict[str, np.ndarray]:
    """A shard's tables as named arrays: ``t{T}.values``, ``t{T}.optimizer.{NAME}``, ``t{T}.ids``."""
    arrays: Dict[str, np.ndarray] = {}
    for t, table in state.tables.items():
        arrays[f"t{t}.values"] = table.values
        arrays.update({f"t{t}.optimizer.{name}": value for name, value in table.optimizer_state.items()})
        if table.sparse:
            arrays[f"t{t}.ids"] = table.ids
    return arrays


def save_model(comm: MPI.Intracomm, directory: str, layout: Layout, state: Optional[ShardState],
               identity: Mapping[str, object], step: int, dense: Optional[Mapping[str, np.ndarray]] = None) -> None:
    """Write this run's model sharded into ``directory`` (collective; see the module docstring);
    ``dense``: the tables no server holds (hybrid), written by rank 0. ``OutputFileError`` on
    every rank if any rank could not write its file."""
    rank = comm.Get_rank()
    if rank == 0:
        remove_regular([os.path.join(directory, MANIFEST)])  # no manifest names a half-written set
    comm.Barrier()
    problem = None
    if state is not None:
        try:
            with atomic_file(os.path.join(directory, shard_name(state.shard)), "wb") as out:
                np.savez(out, **shard_arrays(state))
        except (OSError, OutputFileError) as err:
            problem = f"server rank {rank} could not write shard {state.shard}: {err}"
    if dense is not None and rank == 0 and problem is None:
        try:
            with atomic_file(os.path.join(directory, DENSE), "wb") as out:
                np.savez(out, **dense)
        except (OSError, OutputFileError) as err:
            problem = f"rank 0 could not write the dense parameters ({DENSE}): {err}"
    problems = [text for text in comm.allgather(problem) if text]
    if problems:
        raise OutputFileError("; ".join(problems))
    if rank == 0:
        starts = {str(t): [[p.shard, p.start, p.stop] for p in pieces] for t, pieces in layout.placement.pieces.items()}
        write_json(os.path.join(directory, MANIFEST),
                   {"format": FORMAT, "identity": dict(identity), "step": step, "pieces": starts,
                    "shards": {str(key): shard_name(key) for key in sorted(layout.shard_ranks)},
                    **({"dense": DENSE} if dense is not None else {})})
    comm.Barrier()


Parameters = Dict[str, Dict[str, Any]]


def whole_model(directory: str) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """Every table whole from a ``--model-dir`` or ``--checkpoint-dir`` folder, and what the
    folder says of itself (identity, step, shards); ``CheckpointMismatchError`` naming what
    is missing or does not fit, ``InputFileError`` naming a file that is cut or damaged."""
    manifest_path = os.path.join(directory, MANIFEST)
    if os.path.isfile(manifest_path):
        with _reading(manifest_path):
            manifest = read_json(manifest_path)
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise CheckpointMismatchError(f"{manifest_path} is not an hpcreduce PS model manifest")
            files = [inside(directory, name) for name in manifest["shards"].values()]  # never a path outside
            dense = inside(directory, manifest["dense"]) if "dense" in manifest else None
            whole = _zeros(manifest["identity"]["parameters"])
        _assemble(directory, manifest["identity"], whole, files, lambda t, stored: _starts(manifest, t, stored), dense)
        return whole, manifest
    step = shard_checkpoints.latest_complete(directory)
    if step is None:
        raise CheckpointMismatchError(f"{directory} holds neither a model ({MANIFEST}) nor a complete "
                                      "parameter-server checkpoint")
    files = shard_checkpoints.step_files(directory, step)
    with _reading(files[0]):
        metadata, _ = checkpoint_files.read(files[0], arrays=False)
        whole = _zeros(metadata["identity"]["parameters"])
    _assemble(directory, metadata["identity"], whole, files, None)
    return whole, {"identity": metadata["identity"], "step": step,
                   "shards": [os.path.relpath(path, directory) for path in files]}


@contextmanager
def _reading(path: str) -> Iterator[None]:
    """What a cut or damaged ``path`` raises in the block becomes an ``InputFileError`` naming it."""
    try:
        yield
    except HpcreduceError:
        raise
    except checkpoint_files.UNREADABLE as err:
        raise InputFileError(f"{path} is cut or damaged ({type(err).__name__}: {err}); nothing was "
                             "exported") from None


def _zeros(parameters: Parameters) -> Dict[str, np.ndarray]:
    """Every fixed table whole, zeroed (a dynamic one is put together from its rows)."""
    return {name: np.zeros(tuple(info["shape"]), info["dtype"]) for name, info in parameters.items()
            if not info.get("dynamic")}


def _starts(manifest: Mapping[str, Any], table: int, path: str) -> int:
    key = next(int(k) for k, name in manifest["shards"].items() if os.path.basename(path) == name)
    return next(start for shard, start, _stop in manifest["pieces"][str(table)] if shard == key)


def _assemble(directory: str, identity: Mapping[str, Any], whole: Dict[str, np.ndarray], files: Sequence[str],
              start_of, dense: Optional[str] = None) -> None:
    """Fill ``whole`` from the shard ``files`` (the servers' tables: the identity's ``server
    tables`` when it has them, else every parameter) and the ``dense`` file (hybrid's workers'
    tables); every fixed table must be covered exactly. A dynamic table becomes ``NAME`` (its
    rows, by increasing id) and ``NAME.ids``; an id on two shards is refused."""
    parameters: Parameters = identity["parameters"]
    names = list(identity.get("server tables", parameters))
    covered = {name: 0 for name in parameters}
    rows: Dict[str, list] = {name: [] for name in names if parameters[name].get("dynamic")}
    if dense is not None:
        if not os.path.isfile(dense):
            raise CheckpointMismatchError(f"{directory}: the dense parameters' file {os.path.basename(dense)} "
                                          "is missing")
        with _reading(dense), open_npz(dense) as stored:
            for name in set(stored.files) & set(parameters):
                whole[name][...] = stored[name]
                covered[name] += whole[name].size
    for path in files:
        if not os.path.isfile(path):
            raise CheckpointMismatchError(f"{directory}: the shard file {os.path.basename(path)} is missing")
        with _reading(path), open_npz(path) as stored:
            for t, name in enumerate(names):
                if f"t{t}.values" not in stored:
                    continue
                values = stored[f"t{t}.values"]
                if name in rows:
                    rows[name].append((stored[f"t{t}.ids"], values))
                elif parameters[name]["sparse"]:
                    ids = stored[f"t{t}.ids"]
                    whole[name][ids] = values
                    covered[name] += len(ids)
                else:
                    start = start_of(t, path) if start_of else _checkpoint_start(path, t)
                    whole[name].reshape(-1)[start:start + values.size] = values
                    covered[name] += values.size
    for name, parts in rows.items():
        ids = np.concatenate([ids for ids, _ in parts] or [np.empty(0, np.int64)])
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
            raise CheckpointMismatchError(f"{directory}: row {int(ids[1:][ids[1:] == ids[:-1]][0])} of dynamic "
                                          f"table {name!r} is on two shards")
        row_shape = tuple(parameters[name]["shape"][1:])
        whole[name] = np.concatenate([v for _, v in parts] or [np.empty((0,) + row_shape)]).astype(
            parameters[name]["dtype"], copy=False)[order]
        whole[f"{name}.ids"] = ids
    short = [name for name in parameters if name not in rows and
             covered[name] != (whole[name].shape[0] if parameters[name]["sparse"] else whole[name].size)]
    if short:
        raise CheckpointMismatchError(f"{directory}: the shards do not cover table(s) {short} exactly")


def _checkpoint_start(path: str, table: int) -> int:
    metadata, _ = checkpoint_files.read(path, arrays=False)
    return int(metadata["tables"][str(table)]["start"])


def write_whole(path: str, params: Mapping[str, np.ndarray]) -> None:
    """The whole model as one ``.npz`` of named arrays, atomically; for a device or FIFO,
    which is written through (``runtime.files``), made in memory first: a zip is written
    with seeks, which a device appended to does not take."""
    with atomic_file(path, "wb") as out:
        if not written_through(path):
            np.savez(out, **params)
            return
        buffer = io.BytesIO()
        np.savez(buffer, **params)
        out.write(buffer.getbuffer())
