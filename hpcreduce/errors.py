"""Exceptions raised by hpcreduce; each docstring says what recovery, if any, it triggers."""
from __future__ import annotations


class HpcreduceError(Exception):
    """Base class of every error hpcreduce raises on purpose."""


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
    """An environment variable or setting hpcreduce reads has a value it cannot use.

    Raised on every rank that reads it, before any communication; fix the setting.
    """


class LaunchError(HpcreduceError, RuntimeError):
    """The MPI launcher could not be found or the launch request is inconsistent."""


class DeadlineExceededError(HpcreduceError, TimeoutError):
    """A blocking wait outlived its deadline and MPI reported no failure (a hung peer).

    Not recoverable inside the job (a hung rank cannot take part in a shrink): the
    watchdog prints which wait on which rank timed out and aborts the whole job, so it
    ends with a clear error instead of hanging. ``hpcreduce launch --restarts`` can
    then resume it from the latest checkpoint.
    """
