"""Where a relaunched PS run without ULFM resumes (``fallback``, steps 2-4 of its docstring).

Rank 0 finds the latest complete checkpoint C, counts the acknowledged pushes it lacks from
the workers' push ledgers (``ledger``; with no C but a launch before that pushed, it warns that
the run starts at step 1 again), removes the checkpoints newer than C and the ledgers,
and every rank takes its answer (``Resume.find``). The resume then says at which step every
worker starts and whether the shards keep C's record of each slot's last push (the same
servers and workers as the run that wrote C, under ASP/SSP), and builds each server's shard of
the current placement from C (``shard``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...errors import OutputFileError, SettingProblem, setting_problem
from ...ft.checkpoint_files import UNREADABLE, print_warning
from ...ps.layout import Layout
from ...ps.shard_state import ShardState
from ...runtime.context import Context
from . import shard_checkpoints
from .ledger import count_lost, remove_ledgers
from .ps_setup import PSSetup


@dataclass
class ResumePoint:
    """Checkpoint ``step`` to resume from, written by ``servers`` servers and ``workers``
    workers; ``updates_lost``: acknowledged pieces of the launches before that it lacks."""

    step: int
    servers: int
    workers: int
    updates_lost: int
    pushed_until: int = 0  # 1 + the last step any slot had pushed into C (ASP/SSP)


@dataclass(frozen=True)
class Resume:
    """``point``: the checkpoint resumed from (None: a fresh start); ``keep_pushes``: the shards
    keep its record of each slot's last push; ``first_step``: where every worker starts."""

    point: Optional[ResumePoint]
    keep_pushes: bool = False
    first_step: int = 0

    @classmethod
    def find(cls, ctx: Context, setup: PSSetup) -> "Resume":
        """Collective: rank 0 finds the checkpoint to resume from and clears what is newer; every
        rank gets its answer, or the same ``OutputFileError``."""
        directory = setup.fault.checkpoint_dir
        found: Any = None
        if ctx.rank == 0:
            try:
                found = _resume_point(directory)
            except UNREADABLE as err:  # a file gone or damaged since it was read, a folder not writable
                found = setting_problem("{checkpoint_dir} {path}: cannot resume from it: {why}", path=directory,
                                        why=f"{type(err).__name__}: {err}")
        found = ctx.comm.bcast(found, root=0)
        if isinstance(found, SettingProblem):
            raise OutputFileError(found)
        if found is None:
            return cls(None)
        aggregates = setup.tables.consistency.aggregates
        keep = not aggregates and (found.servers, found.workers) == (setup.ps.servers, ctx.size - setup.ps.servers)
        return cls(found, keep, found.step if aggregates or keep else max(found.step, found.pushed_until))

    def shard(self, setup: PSSetup, layout: Layout, key: int) -> ShardState:
        """Shard ``key`` of ``layout`` as the checkpoint holds it, ready for workers that all
        start at ``first_step``: their clocks at it; unless ``keep_pushes``, no push of theirs taken yet."""
        tables, step = setup.tables, self.first_step
        state = shard_checkpoints.restore_shard(setup.fault.checkpoint_dir, self.point.step, key, tables.specs,
                                                layout.placement, tables.optimizers, layout.slot_count)
        state.clocks[:] = step
        state.applied_steps = step
        for table in state.tables.values():
            if not self.keep_pushes:
                table.last_push[:] = step - 1
            table.read_version[:] = table.version
        return state


def _resume_point(directory: str) -> Optional[ResumePoint]:
    """Rank 0: the latest complete checkpoint and the pushes it lacks; removes the newer
    checkpoints and the push ledgers."""
    step = shard_checkpoints.latest_complete(directory) or 0
    record = shard_checkpoints.saved_last_pushes(directory, step) if step else {}
    lost = count_lost(directory, step, record, print_warning)
    shard_checkpoints.remove_newer(directory, step)
    remove_ledgers(directory)
    if not step:
        if lost:  # a launch before this one trained and was stopped or killed before its first checkpoint
            print_warning(f"{directory}: no complete checkpoint to resume from, so this run starts at step 1; "
                          f"the {lost} acknowledged updates of the launch before are redone (checkpoint more "
                          "often, --checkpoint-every, than the job is stopped)")
        return None
    metadata = shard_checkpoints.step_metadata(directory, step)
    pushed = [int(last.max()) for tables in record.values() for last in tables.values() if last.size]
    return ResumePoint(step, len(metadata["keys"]), int(metadata["slot_count"]), lost, max(pushed, default=-1) + 1)
