"""The paths one command reads and writes, checked together before it starts anything.

Every command that writes files (``train``, ``export``, ``report``, ``bench``) describes its
inputs and outputs as ``Place``s and asks ``place_problems``, the one check they all go
through: each output must be writable (``files.path_problem``, ``files.folder_problem``), and
no output may be an input or another output, nor lie inside a folder the same run reads or
writes (``--json D/manifest.json`` with ``--data D``, ``export M --out M/shard-0.npz``,
``--model-dir D`` with ``--data D``): an output never replaces what its run reads. Paths are
compared where their symlinks lead. What is written through (``/dev/stdout``, a device, a
FIFO) is never replaced, so it may be named more than once.

Problems are ``SettingProblem``s whose fields are the places' labels: a ``TrainConfig``
field (``json_path``, worded ``--json`` by the command line) or the flag itself (``--out``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..errors import SettingProblem, setting_problem
from .files import folder_problem, path_problem, written_through


@dataclass(frozen=True)
class Place:
    """A path a command reads (``output`` False) or writes: one file, or a ``folder`` of them."""

    label: str
    path: str
    folder: bool = False
    output: bool = True

    @property
    def named(self) -> str:
        return "{%s} {%s_path}" % (self.label, self.label)

    def where(self) -> str:
        return os.path.realpath(self.path)


def place_problems(places: Sequence[Place]) -> List[SettingProblem]:
    """Why the outputs among ``places`` could not be written, or would replace an input or
    each other (see the module docstring); unset paths (None, empty) are left out."""
    given = [place for place in places if place.path]
    found = [_writable_problem(place) for place in given if place.output]
    shared = [place for place in given if not (place.output and written_through(place.path))]
    for i, first in enumerate(shared):
        for second in shared[i + 1:]:
            found.append(_clash(first, second))
    return [problem for problem in found if problem is not None]


def _writable_problem(place: Place) -> Optional[SettingProblem]:
    why = folder_problem(place.path) if place.folder else path_problem(place.path)
    return _problem(place.named + ": {why}", [place], why=why) if why else None


def _clash(first: Place, second: Place) -> Optional[SettingProblem]:
    """How ``first`` and ``second`` collide (one is, or lies inside, the other), or None."""
    if not (first.output or second.output):
        return None
    a, b = first.where(), second.where()
    if a == b:
        if first.output and second.output:
            kind = "folder" if first.folder and second.folder else "file"
            return _problem("{%s} and {%s} name one %s, {path}: give each its own"
                            % (first.label, second.label, kind), [], path=first.path)
        output, source = (first, second) if first.output else (second, first)
        return _problem(output.named + " is " + source.named + ", an input of this run: writing it would "
                        "destroy it; give another path", [output, source])
    for inner, outer, inner_at, outer_at in ((first, second, a, b), (second, first, b, a)):
        if outer.folder and inner.output and os.path.commonpath([inner_at, outer_at]) == outer_at:
            what = "an input of this run" if not outer.output else "a folder this run also writes"
            return _problem(inner.named + " lies inside " + outer.named + f", {what}: give a path outside it",
                            [inner, outer])
    return None


def _problem(template: str, places: Sequence[Place], **values: object) -> SettingProblem:
    return setting_problem(template, **values, **{f"{place.label}_path": place.path for place in places})
