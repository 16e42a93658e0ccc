"""Checkpoints of an elastic torch run that plain ``torch.load`` reads.

    hpcreduce.torch.save_checkpoint(state, "ckpt", step)        # collective; rank 0 writes
    step = hpcreduce.torch.load_checkpoint(state, "ckpt")        # collective; None: none there
    torch.load("ckpt/ckpt-000000100.pt", weights_only=True)      # {"values": ..., "hpcreduce": ...}

A checkpoint is one file, ``FOLDER/ckpt-STEP.pt``, written by ``torch.save`` on rank 0: a dict
of ``values`` (every tracked value as ``State.state_dict()`` gives it: a module's and an
optimizer's ``state_dict()``, tensors, scalars; numpy arrays stored as tensors) and
``hpcreduce`` (``step``, ``ranks``, ``commits`` and the run's ``identity``: the caller's, plus
the names of the tracked values). It is written atomically (``ft.checkpoint_files``: a
temporary, fsync, rename; a writer killed half way leaves the previous checkpoint whole) and the
newest ``keep`` are kept; every rank learns whether it could (``OutputFileError`` on every
rank otherwise, also for a value ``torch.load(weights_only=True)`` could not read back). The
policy's ``checkpoint`` kills strike half way through the file, as for numpy checkpoints.
A step the file name cannot hold (below 0, over 999999999) is refused on every rank.
``load_checkpoint``: rank 0 reads the newest checkpoint that reads back whole (passing over, with
a warning, one that does not or whose metadata is not a checkpoint's), refuses on every rank one
written by another run (``CheckpointMismatchError``: identity named), sends its values to every
rank (``send_tree``), and every rank loads them into its tracked objects in place, keeping a copy
of what they held: when any rank's objects refuse them (a value whose tensors differ, a sampler
over another data set), every rank puts its copy back and raises the same
``CheckpointMismatchError`` naming the ranks, so a refusal changes nothing. A ``resume`` change
is recorded. Cost: ``torch.save`` on rank 0, a small broadcast and one agreement; loading:
``torch.load`` on rank 0, a broadcast of the values, a copy of the state and one allgather.
"""
from __future__ import annotations

import io
import os
import pickle
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import torch

from ..arrays import to_host
from ..collectives import agree
from ..elastic.checkpoints import record_resume, written_by_rank_0
from ..elastic.state import State
from ..elastic.state_dicts import clone_tree, is_leaf, rebuild, send_tree
from ..errors import CheckpointMismatchError, InputMismatchError, OutputFileError, setting_problem
from ..ft import checkpoint_files
from ..runtime.files import remove_stale_temporaries

NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
READABLE = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
"""What ``torch.load(weights_only=True)`` reads back, besides tensors and containers."""
UNREADABLE = checkpoint_files.UNREADABLE + (RuntimeError, pickle.UnpicklingError, AttributeError)


def save_checkpoint(state: State, folder: str, step: int, *, identity: Optional[Mapping[str, Any]] = None,
                    keep: int = 2) -> str:
    """Rank 0 writes the checkpoint of ``step`` into ``folder`` (collective; see the module
    docstring), keeping the newest ``keep``; returns its path."""
    def write(halfway) -> None:
        values = {name: _storable(value) for name, value in state.state_dict().items()}
        unreadable = next(((name, found) for name, value in values.items() for found in [_unreadable(value)]
                           if found), None)
        if unreadable:
            raise OutputFileError(f"cannot write {path}: the value {unreadable[0]!r} holds {unreadable[1]}, "
                                  "which torch.load(weights_only=True) cannot read (track numbers, strings, "
                                  "tensors, and dicts, lists or tuples of them)")
        metadata = {"step": step, "ranks": state.context.size, "commits": state.commits,
                    "identity": _identity(state, identity)}
        checkpoint_files.path_for(folder, step)  # refuses a step the name cannot hold
        buffer = io.BytesIO()
        torch.save({"values": values, "hpcreduce": metadata}, buffer)
        remove_stale_temporaries(folder)
        checkpoint_files.write_checkpoint(folder, path, buffer.getbuffer(), keep=keep, halfway=halfway, name=NAME)

    path = os.path.join(folder, f"ckpt-{step:09d}.pt")
    written_by_rank_0(state, step, write)
    return path


def load_checkpoint(state: State, folder: str, *, identity: Optional[Mapping[str, Any]] = None) -> Optional[int]:
    """The step of the newest checkpoint in ``folder``, its values loaded into the tracked
    objects on every rank (collective), or None when there is none (see the module docstring).
    A refusal, on any rank, leaves every rank's objects as they were."""
    ctx = state.context
    found: Tuple[Optional[int], int, Optional[str], Any] = (None, 0, None, None)
    if ctx.rank == 0:
        try:
            remove_stale_temporaries(folder)  # the writer, before it writes
            found = _read_newest(state, folder, identity)
        except Exception as err:  # whatever rank 0 met is every rank's news, never a hang
            found = (None, 0, f"could not be read: {type(err).__name__}: {err}", None)
    step, ranks, problem = ctx.comm.bcast(found[:3], root=0)
    if problem is None and step is not None:
        problem = _load_everywhere(state, send_tree(ctx, found[3]))
    if problem:
        raise CheckpointMismatchError(setting_problem("{checkpoint_dir} {path}: its checkpoint of step {step} "
                                                      "{why}; give another folder or empty it",
                                                      path=folder, step=step, why=problem))
    if step is None:
        return None
    record_resume(state, step, ranks)
    return step


def _read_newest(state: State, folder: str, identity: Optional[Mapping[str, Any]]) -> Tuple[Optional[int], int,
                                                                                             Optional[str], Any]:
    """Rank 0: (step, ranks, problem, values) of the newest checkpoint that reads back whole
    (problem: how its identity differs from this run's, or None), or (None, 0, None, None)."""
    for step, path in reversed(checkpoint_files.checkpoints(folder, NAME)):
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(stored, dict) or not isinstance(stored.get("values"), dict):
                raise ValueError(f"it holds a {type(stored).__name__}, not a checkpoint's dict of values")
            metadata = checkpoint_files.checked(stored.get("hpcreduce"))
            if "ranks" not in metadata:
                raise ValueError("its metadata names no ranks")
        except UNREADABLE + (TypeError, IndexError) as err:
            checkpoint_files.print_warning(f"checkpoint {path} is unreadable ({type(err).__name__}: {err}); "
                                           "passed over")
            continue
        problem = checkpoint_files.identity_problem(metadata, _identity(state, identity))
        return step, int(metadata["ranks"]), problem, None if problem else stored["values"]
    return None, 0, None, None


def _load_everywhere(state: State, values: Any) -> Optional[str]:
    """``values`` (rank 0's, on every rank) loaded into ``state`` on every rank (collective: one
    allgather), or, when any rank's objects refuse them, every rank's objects put back as they
    were and the refusals named."""
    kept = clone_tree(state.whole_state_dict())  # a sharded optimizer's too, without consolidating first
    try:
        state.load_state_dict(values)
        refused = None
    except InputMismatchError as err:
        refused = str(err)
    try:
        agree(refused, comm=state.context)
        return None
    except InputMismatchError as err:
        state.load_state_dict(kept)
        return f"does not fit this run's values (nothing was loaded): {err}"


def _identity(state: State, identity: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The run identity a checkpoint carries: the caller's, and the tracked values' names."""
    return {**(identity or {}), "tracked": state.names}


def _storable(value: Any) -> Any:
    """``value`` with its numpy and cupy arrays as CPU tensors (which weights_only loading reads)."""
    return rebuild(value, is_leaf, lambda leaf: leaf if isinstance(leaf, torch.Tensor)
                   else torch.from_numpy(np.array(to_host(leaf))))


def _unreadable(value: Any) -> Optional[str]:
    """The type of the first thing in ``value`` that ``torch.load(weights_only=True)`` would not
    read back, or None."""
    if isinstance(value, (torch.Tensor, READABLE)):
        return None
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        items = list(value)
    else:
        return f"a {type(value).__name__}"
    return next((found for item in items for found in [_unreadable(item)] if found), None)
