"""The refusal of an optimizer step over gradients accumulated inside ``no_sync`` and never
reduced: torch's global optimizer pre-hook, installed by the first live reducer and removed
with the last one, so importing ``hpcreduce.torch`` installs none."""
from __future__ import annotations

import weakref
from typing import Any, List, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..errors import UnsupportedInputError

LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()
"""The live reducers (``reducer.Reducer``: ``fresh``, ``running``, ``where``)."""


class StepGuard:
    """Refuses an optimizer step over gradients accumulated inside ``no_sync`` and never
    reduced: torch's global optimizer pre-hook, registered while a reducer lives."""

    def __init__(self) -> None:
        self._handle: Optional[Any] = None
        self._holders = 0

    @property
    def installed(self) -> bool:
        return self._handle is not None

    def hold(self, reducer: Any, handles: List[Any]) -> None:
        """Install the pre-hook (if not yet) for as long as ``reducer`` lives; when it goes, remove
        its parameters' hooks (``handles``) too."""
        LIVE.add(reducer)
        if self._handle is None:
            self._handle = register_optimizer_step_pre_hook(before_step)
        self._holders += 1
        weakref.finalize(reducer, self._release, handles)

    def _release(self, handles: List[Any]) -> None:
        for handle in handles:
            handle.remove()
        self._holders -= 1
        if self._holders == 0 and self._handle is not None:
            self._handle.remove()
            self._handle = None


def before_step(optimizer: torch.optim.Optimizer, _args, _kwargs) -> None:
    """The pre-hook: raise when ``optimizer`` would step on a parameter's unreduced gradient."""
    for reducer in list(LIVE):
        if reducer.fresh and not reducer.running:
            stepping = {id(p) for group in optimizer.param_groups for p in group["params"]}
            unsynced = stepping & reducer.fresh
            if unsynced:
                bucket, position = reducer.where[next(iter(unsynced))]
                name = bucket.names[position]
                raise UnsupportedInputError(
                    f"optimizer.step() over gradients accumulated inside no_sync() and not reduced "
                    f"(parameter {name!r} among {len(unsynced)}): every rank would step on its own gradient. "
                    f"Run the last backward of the accumulation outside no_sync()")


STEP_GUARD = StepGuard()
