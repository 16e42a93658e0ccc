"""Checkpoints of an elastic run: rank 0 writes, every rank learns whether it could; resumed at start.

``save_checkpoint`` writes named arrays atomically (``ft.checkpoint_files``; the policy's
``checkpoint`` kills strike half way) and broadcasts whether it could, so a file that cannot
be written is an ``OutputFileError`` on every rank; the broadcast is an ``agreed`` block, so
rank 0 dying meanwhile is recovered from (``Interrupted``) before anyone goes on.
``resume_checkpoint`` fills the arrays from the newest checkpoint that reads back whole,
refusing (on every rank, before any array is overwritten) one written by another run
(``identity_problem``) or whose arrays do not fit, and records a
``resume`` change. Checkpoints hold whole arrays, so a run resumes with any number of ranks. Cost: the write, on rank 0,
a small broadcast and one agreement.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional

from ..arrays import copy_into
from ..errors import CheckpointMismatchError, OutputFileError, setting_problem
from ..ft import checkpoint_files
from ..ft.events import RecoveryEvent
from ..runtime.files import remove_stale_temporaries
from .agreement import agreed

if TYPE_CHECKING:
    from .state import State


def save_checkpoint(state: "State", folder: str, step: int, arrays: Mapping[str, Any],
                    metadata: Dict[str, Any], keep: int = 2) -> None:
    """Rank 0 writes the checkpoint of ``step`` (``arrays``; ``metadata`` plus the number of
    ranks) into ``folder``, keeping the newest ``keep``; every rank learns whether it could (an
    ``OutputFileError`` everywhere if not)."""
    ranks = state.context.size
    written_by_rank_0(state, step, lambda halfway: checkpoint_files.save(
        folder, step, arrays, {"ranks": ranks, **metadata}, keep=keep, halfway=halfway))


def written_by_rank_0(state: "State", step: int, write: Callable[[Callable[[], None]], Any]) -> None:
    """Rank 0 calls ``write(halfway)`` (``halfway``: the policy's ``checkpoint`` kills of
    ``step``, to run half way through the file); every rank learns whether it could: the
    ``OutputFileError`` it raised (or one naming any other error), on every rank. The news is
    an ``agreed`` block, so rank 0 dying meanwhile is recovered from (``Interrupted``) before
    anyone goes on."""
    ctx, job = state.context, state.job
    failure = None
    if ctx.rank == 0:
        try:
            write(lambda: job.policy.kills.strike("checkpoint", step, job.members.me, job.members.ids))
        except OutputFileError as err:
            failure = err.parts
        except Exception as err:  # anything else rank 0 met is every rank's news too, never a hang
            failure = (f"cannot write the checkpoint of step {step}: {type(err).__name__}: {err}",)
    failure = agreed(ctx, lambda: ctx.comm.bcast(failure, root=0), f"checkpoint of step {step}")
    if failure:
        raise OutputFileError(*failure)


def resume_checkpoint(state: "State", folder: str, identity: Mapping[str, Any],
                      arrays: Mapping[str, Any]) -> Optional[int]:
    """The step of the newest checkpoint in ``folder``, its arrays copied into ``arrays`` (in
    place), or None when there is none; ``CheckpointMismatchError`` on every rank when it was
    written by a run of another ``identity``. Rank 0 first removes dead writers' temporaries."""
    ctx = state.context
    if ctx.rank == 0:  # the writer, before it writes
        remove_stale_temporaries(folder)
    found = checkpoint_files.load_latest(folder, checkpoint_files.print_warning if ctx.rank == 0 else _silent)
    if found is None:
        return None
    metadata, saved = found
    problem = checkpoint_files.identity_problem(metadata, identity) or _arrays_problem(saved, arrays)
    if problem:
        raise CheckpointMismatchError(setting_problem("{checkpoint_dir} {path}: its checkpoint of step {step} "
                                                      "{why}; give another folder or empty it",
                                                      path=folder, step=metadata["step"], why=problem))
    for name, array in arrays.items():
        copy_into(array, saved[name])
    step = int(metadata["step"])
    record_resume(state, step, int(metadata.get("ranks", ctx.size)))
    return step


def _arrays_problem(saved: Mapping[str, Any], arrays: Mapping[str, Any]) -> Optional[str]:
    """How the checkpoint's arrays differ from ``arrays`` (a name missing, another shape), first
    only, checked before any array is overwritten; None when every one fits."""
    for name, array in arrays.items():
        if name not in saved:
            return f"holds no array {name!r}"
        if tuple(saved[name].shape) != tuple(array.shape):
            return f"holds {name!r} of shape {tuple(saved[name].shape)}, this run's is {tuple(array.shape)}"
    return None


def record_resume(state: "State", step: int, ranks: int) -> None:
    """The ``resume`` change of a run resumed from the checkpoint of ``step`` written by
    ``ranks`` ranks: in ``state.events``, on the policy's console, and the reset callbacks run."""
    change = RecoveryEvent("resume", step + 1, ranks, time.time())
    change.ranks_after = state.context.size
    state._reset(change)
    state.job.policy.echo(f"resumed from the checkpoint of step {step} "
                          f"(written by {ranks} ranks, now {state.context.size})")


def _silent(_text: str) -> None:
    """Warnings of ranks other than rank 0 (which prints the same)."""
