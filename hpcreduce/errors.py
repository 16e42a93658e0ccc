"""Every exception hpcreduce raises on purpose; each docstring says what recovery, if any, it triggers.

Settings are checked by the layer that reads them and reported by field name
(``SettingProblem``: ``fetch_every``, ``servers``); the command line shows the same
problems with its flag names (``--fetch-every``, ``--servers``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union


class _FieldNames(dict):
    """A field placeholder with no name given renders as the field's own name."""

    def __missing__(self, key: str) -> str:
        return key


@dataclass(frozen=True)
class SettingProblem:
    """What is wrong with some settings, worded by their field names.

    ``template`` writes each setting it is about as a ``{field}`` placeholder and each
    value it quotes as a placeholder filled from ``values``. ``render(names)`` writes a
    field as ``names[field]`` (the CLI passes its flags), else as the field name.
    """

    template: str
    values: Mapping[str, object] = field(default_factory=dict)

    def render(self, names: Mapping[str, str] = {}) -> str:  # noqa: B006 (read only)
        return self.template.format_map(_FieldNames({**names, **self.values}))

    def __str__(self) -> str:
        return self.render()


def setting_problem(template: str, **values: object) -> SettingProblem:
    """``SettingProblem(template, values)``: fields as ``{field}``, quoted values by keyword."""
    return SettingProblem(template, values)


Problem = Union[str, SettingProblem]


def worded(problem: Problem, names: Mapping[str, str] = {}) -> str:  # noqa: B006 (read only)
    """A problem as text, its fields written as ``names`` gives them (see ``SettingProblem``)."""
    return problem.render(names) if isinstance(problem, SettingProblem) else str(problem)


class HpcreduceError(Exception):
    """Base class of every error hpcreduce raises on purpose.

    The message is made of ``parts``: text, and problems that name settings by field
    (``SettingProblem``); ``render(names)`` words those fields with other names.
    """

    def __init__(self, *parts: Problem):
        self.parts = parts
        super().__init__(self.render())

    def render(self, names: Mapping[str, str] = {}) -> str:  # noqa: B006 (read only)
        return "".join(worded(part, names) for part in self.parts)


class InputMismatchError(HpcreduceError, ValueError):
    """Ranks passed inputs that cannot be reduced together (shape, dtype, op, count).

    Raised on every rank of the call, before any data moves; no state changed and no
    recovery runs. Fix the caller and call again.
    """


class UnsupportedInputError(HpcreduceError, TypeError):
    """A dtype, op, array kind or layout that hpcreduce does not reduce.

    Raised on every rank before any data moves (when the cross-rank check is on);
    no state changed.
    """


class FaultToleranceUnavailableError(HpcreduceError, RuntimeError):
    """Fault tolerance was asked for, but this launch cannot detect failed ranks.

    Raised at start-up, before training; relaunch with ULFM enabled
    (``hpcreduce launch --ft``) or without ``--ft``.
    """


class ConfigurationError(HpcreduceError, ValueError):
    """Settings (or an environment variable) hpcreduce reads have values it cannot use.

    Raised on every rank that reads them, before any communication; fix the settings.
    ``problems`` lists each one; ``render(names)`` words them with other names for the
    fields (the CLI's flags).
    """

    def __init__(self, problems: Union[Problem, Iterable[Problem]]):
        self.problems = [problems] if isinstance(problems, (str, SettingProblem)) else list(problems)
        separated = [part for problem in self.problems for part in ("; ", problem)][1:]
        super().__init__(*separated)


class LaunchError(HpcreduceError, RuntimeError):
    """The MPI launcher could not be found or the launch request is inconsistent."""


class DeadlineExceededError(HpcreduceError, TimeoutError):
    """A blocking wait outlived its deadline and MPI reported no failure (a hung peer).

    Not recoverable inside the job (a hung rank cannot take part in a shrink): the
    watchdog prints which wait on which rank timed out and aborts the whole job, so it
    ends with a clear error instead of hanging. ``hpcreduce launch --restarts`` can
    then resume it from the latest checkpoint.
    """


class ProcessLostError(HpcreduceError, RuntimeError):
    """A rank of the job died (ULFM reported it) where nothing recovers in place (a dedicated
    hybrid job's servers and trainers). Raised on every rank that waits on the lost one, naming
    it; the communicator is revoked first, so every rank blocked in it returns and raises it too.
    Resume from a checkpoint, or run under ``hpcreduce.elastic`` where a layout recovers in place.
    """


class GpuUnavailableError(HpcreduceError, RuntimeError):
    """GPU work was asked for, but cupy or a visible GPU is missing on some rank.

    Raised before any data moves; nothing to recover. Install cupy (``hpcreduce[gpu]``)
    and run where the ranks see a GPU, or leave the GPU option out.
    """


class PSConfigError(ConfigurationError):
    """The parameter-server settings cannot run on this job (servers vs ranks, consistency).

    Raised on every rank before any message is sent (every rank checks the same
    settings); nothing started.
    """


class PSInputError(HpcreduceError, ValueError):
    """A worker call with bad arguments (unknown table, wrong shape or dtype, a read-only
    output, ids out of range or repeated) or on a worker already released. Raised by the
    worker before anything is sent; no state changed and the worker stays usable."""


class PSRefusedError(HpcreduceError, RuntimeError):
    """A server refused a request (e.g. a gradient with NaN or Inf, a stale placement).

    The server counted the refusal, left its parameters unchanged and keeps serving;
    the worker may carry on with other requests.
    """


class ModelError(HpcreduceError, ValueError):
    """A model broke the ``Model`` contract: its gradients do not match its parameters
    (a missing or extra name, a wrong shape, dtype or kind, bad sparse row ids).

    Raised on the rank whose model returned them, before they are used; training turns
    it into ``TrainingError`` on every rank. Fix the model.
    """


class TrainingError(HpcreduceError, RuntimeError):
    """Training stopped: a model failed on some rank (``ModelError`` or its own error), or
    a gradient was NaN or Inf (refused, never applied).

    Raised on every rank, naming the step, the failing ranks and their reasons, with the
    parameters as the last applied step left them; the job exits instead of hanging.
    """


class PSTrainingError(TrainingError):
    """Parameter-server training failed on some rank (a refused push, a model error, a
    server that could not set up, a recovery with nothing left to recover from).

    Raised on every rank once the servers have stopped cleanly, with the failing rank and
    its reason; the job exits instead of hanging.
    """


class PlottingUnavailableError(HpcreduceError, ImportError):
    """matplotlib is not installed: ``pip install 'hpcreduce[plot]'``. Nothing was drawn."""


class UnknownResultError(HpcreduceError, ValueError):
    """The file is not a result ``hpcreduce report`` knows how to draw. Nothing was drawn."""


class OutputFileError(HpcreduceError, RuntimeError):
    """A result, metrics, timeline or checkpoint file could not be written; the message
    names the path and the system's reason (no space, permission, a folder in the way).

    A file replaced atomically keeps its previous content and no temporary is left.
    Training raises it on every rank, at the end for result and metrics files (what could
    be written was), at once for a checkpoint. Fix the path or free space and rerun.
    """


class InputFileError(HpcreduceError, ValueError):
    """A file hpcreduce reads is missing, truncated or damaged (a shard of ``--data``, a model
    folder's shard or manifest); the message names the file and what is wrong with it.

    Nothing was written from it. In training it stops the run with ``TrainingError`` on every
    rank, naming the rank and the file. Restore or rewrite the file and rerun.
    """


class CheckpointMismatchError(ConfigurationError):
    """The checkpoint folder holds checkpoints of another run (another model, seed, batch,
    optimizer...); the message names the first difference. Nothing was restored.

    Raised on every rank before training. Give another checkpoint folder, or remove it.
    """
