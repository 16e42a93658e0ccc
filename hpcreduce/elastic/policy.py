"""``Policy``: how an elastic run changes its job, given as values.

A user's loop gets the default: growth and scale-in only from ``State(discover=FILE)``,
no injected kills, nothing printed but warnings (Python's), ULFM required, and the job marked done for
``hpcreduce launch`` once ``run`` returned after a change. A trainer (the ring) passes its
own: the ``ft.resize.GrowthRule`` of its flags, the ``ft.inject.KillSchedule``, whether a
lost rank is replaced, what each change reports (``data_shards``), where lines go, and how
its step is numbered.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, List, Optional, Sequence

from ..ft.inject import KillSchedule
from ..ft.resize import GrowthRule


def commit_count(state: Any) -> int:
    """The default numbering of a run's moments: the state's commits so far (``State.commits``)."""
    return state.commits


def no_shards(_ids: Sequence[int]) -> List[List[Any]]:
    """The default ``data_shards`` of a change: none reported."""
    return []


def silent(_line: str) -> None:
    """The default ``echo``: recovery lines are not printed."""


def python_warning(line: str) -> None:
    """The default ``warn``: a ``RuntimeWarning`` (Python's warnings: printed once by default)."""
    warnings.warn(line, RuntimeWarning, stacklevel=2)


@dataclass(frozen=True)
class Policy:
    """``growth``: when ranks leave or join (``--grow``/``--leave`` entries, the discovery file,
    read at the moments ``GrowthRule.reads_target`` names); ``known_hosts(nodes)``: the hosts a
    discovery file may name, given every rank's node (``ft.resize.known_hosts``; None: any host,
    and the nodes are gathered only for a file of hosts); ``replace``: spawn one rank per rank lost after a
    recovery; ``kills``: injected failures (``recovery`` kills strike between revoke and
    shrink, ``checkpoint`` kills half way through ``save_checkpoint``; ``step`` kills are the
    loop's to strike); ``data_shards(ids)``: who reads which training shards after a change,
    ranks by stable id in rank order; ``echo``: rank 0's console (recovery lines); ``warn``:
    rank 0's warnings (a discovery file it cannot use or that asks for more ranks than there
    are slots); ``step_of(state)``: the number of the moment a change happens
    at (the step being attempted; default the commit count); ``needs_ulfm``: without ULFM
    ``run`` refuses (else it calls the loop once, and every ``agreed`` block runs under the
    deadline watchdog); ``marks_done``: rank 0 marks the job done once ``run`` returned after
    a change."""

    growth: GrowthRule = GrowthRule()
    known_hosts: Optional[Callable[[List[str]], Collection[str]]] = None
    replace: bool = False
    kills: KillSchedule = field(default_factory=KillSchedule)
    data_shards: Callable[[Sequence[int]], List[List[Any]]] = no_shards
    echo: Callable[[str], None] = silent
    warn: Callable[[str], None] = python_warning
    step_of: Callable[[Any], int] = commit_count
    needs_ulfm: bool = True
    marks_done: bool = True
