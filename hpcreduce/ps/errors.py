"""Errors of the parameter server; each docstring says what state survives."""
from __future__ import annotations

from ..errors import HpcreduceError


class PSConfigError(HpcreduceError, ValueError):
    """The PS settings cannot run on this job (servers K vs ranks N, consistency flags).

    Raised on every rank before any message is sent (every rank checks the same
    settings); nothing started.
    """


class PSInputError(HpcreduceError, ValueError):
    """A worker call with bad arguments: unknown table, wrong shape or dtype, ids out of
    range or repeated. Raised by the worker before anything is sent; no state changed."""


class PSRefusedError(HpcreduceError, RuntimeError):
    """A server refused a request (e.g. a gradient with NaN or Inf, a stale placement).

    The server counted the refusal, left its parameters unchanged and keeps serving;
    the worker may carry on with other requests.
    """


class PSTrainingError(HpcreduceError, RuntimeError):
    """PS training failed on some rank (a refused push, a model error, a server that
    could not set up). Raised on every rank once the servers have stopped cleanly, with
    the failing rank and its reason; the job exits instead of hanging."""
