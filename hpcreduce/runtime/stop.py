"""Stop signals: a scheduler's warning (Slurm's ``--signal=B:USR1@120``, a preemption's SIGTERM)
turned into a request that the run stops at its next step boundary, saves and exits resumable.

``requests.install(signals)`` catches ``signals`` (default: SIGUSR1 and SIGTERM, from
``HPCREDUCE_STOP_SIGNALS`` or ``--stop-signals``); the handler only records the first signal,
so a second one changes nothing. The trainers read ``requests.seen`` (a Python attribute: no
system call, no message) and fold it into an exchange each step already makes, so every rank
stops after the same step; then they checkpoint and exit ``RESUMABLE_EXIT``.
A rank of ``hpcreduce train`` catches them from the first lines of ``python -m hpcreduce``
(``hold_early``, before the heavy imports and MPI's start) and holds a signal that comes then
until the trainer looks; once the flags are read ``install`` keeps it, or gives it back to the
signal's own handler (a signal not in ``--stop-signals``).
``hpcreduce launch`` passes a stop signal on to mpirun as SIGUSR1 (Open MPI 5's mpirun relays
SIGUSR1 and SIGUSR2 to every rank; a SIGTERM would end them), srun's ``--signal`` reaches every task.
"""
from __future__ import annotations

import os
import signal
from typing import Any, Dict, List, NoReturn, Optional, Tuple

from ..errors import OutputFileError
from .environment import detect_launcher
from .settings import Setting

RESUMABLE_EXIT = 75
"""The exit code of a run stopped by a stop signal after its checkpoint was written: start it again
over the same checkpoint folder and it goes on (BSD's EX_TEMPFAIL; the jobs' scripts requeue on it)."""
NAMES = ("USR1", "USR2", "TERM", "INT")


def parse_signals(text: str) -> Tuple[signal.Signals, ...]:
    """``USR1,TERM`` (names with or without ``SIG``, any case) or ``none``: the signals, in order."""
    words = [word.strip().upper().removeprefix("SIG") for word in text.split(",") if word.strip()]
    if words == ["NONE"]:
        return ()
    unknown = [word for word in words if word not in NAMES]
    if unknown or not words:
        raise ValueError(f"expected a comma list of {', '.join(NAMES)} or none, got {text!r}")
    return tuple(dict.fromkeys(signal.Signals[f"SIG{word}"] for word in words))


STOP_SIGNALS = Setting("HPCREDUCE_STOP_SIGNALS", parse_signals, (signal.SIGUSR1, signal.SIGTERM),
                       "a comma list of USR1, USR2, TERM, INT, or none")


def relayed(signum: int, signals: Tuple[signal.Signals, ...]) -> int:
    """The signal a launcher sends mpirun for stop signal ``signum``: itself when mpirun relays it
    to the ranks (USR1, USR2), else the first of those the ranks catch (SIGUSR1 when none is, which
    the ranks then do not catch: give ``USR1`` in the list for ``TERM`` to reach them through mpirun)."""
    if signum in (signal.SIGUSR1, signal.SIGUSR2):
        return signum
    return next((s for s in signals if s in (signal.SIGUSR1, signal.SIGUSR2)), signal.SIGUSR1)


class StopRequests:
    """The first stop signal this process received (``seen``: its number, None until one came)."""

    def __init__(self) -> None:
        self.seen: Optional[int] = None
        self.signals: Tuple[signal.Signals, ...] = ()
        self._previous: Dict[int, object] = {}

    def install(self, signals: Tuple[signal.Signals, ...]) -> None:
        """Catch ``signals`` from now on (those caught before and not in ``signals`` go back); a
        signal seen before and not in ``signals`` is raised again, to its own handler."""
        self.uninstall()
        self.signals = tuple(signals)
        self._previous = {sig: signal.signal(sig, self._record) for sig in self.signals}
        if self.seen is not None and self.seen not in self.signals:
            seen, self.seen = self.seen, None
            signal.raise_signal(seen)

    def uninstall(self) -> None:
        """Back to the handlers there were before ``install``; what was seen is kept."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous, self.signals = {}, ()

    def name(self) -> str:
        """The signal seen, as its name (``SIGUSR1``), or ``a stop signal``."""
        return signal.Signals(self.seen).name if self.seen else "a stop signal"

    def _record(self, signum: int, _frame) -> None:
        if self.seen is None:
            self.seen = signum


requests = StopRequests()
"""This process's stop requests: the only place they are kept."""


def hold_early(argv: List[str]) -> None:
    """The first lines of ``python -m hpcreduce``: a rank of ``train`` (under mpirun or srun)
    catches the stop signals of ``HPCREDUCE_STOP_SIGNALS`` (set by the launcher from
    ``--stop-signals``; the default when unset or unreadable, which the run reports later)."""
    if argv[:1] != ["train"] or detect_launcher() == "none":
        return
    try:
        signals = STOP_SIGNALS.value(os.environ)
    except ValueError:
        signals = STOP_SIGNALS.default
    requests.install(signals)


class StoppedEarly(SystemExit):
    """Every rank stopped at the same step boundary on a stop signal. ``step``: steps (or
    commits) done; ``saved``: where the checkpoint of it is (None: nothing was saved, not
    resumable); ``code``: the exit code (``RESUMABLE_EXIT`` when saved, else 128 + the signal).
    A ``SystemExit``: a script that does not catch it exits with ``code``."""

    def __init__(self, step: int, saved: Optional[str], signum: Optional[int], unit: str = "step"):
        what = f"stopped by {requests.name() if signum else 'a stop signal'} after {unit} {step}"
        super().__init__(f"{what}; checkpoint in {saved}: start the job again over it to go on (exit "
                         f"{RESUMABLE_EXIT})" if saved else
                         f"{what}; no checkpoint folder, nothing saved: the run cannot resume")
        self.step, self.saved = step, saved
        self.code = RESUMABLE_EXIT if saved else 128 + (signum or signal.SIGUSR1)

    def __str__(self) -> str:
        return str(self.args[0])


def stopped_after(comm: Any, problem: Optional[str], done: int, saved: Optional[str],
                  unit: str = "step") -> NoReturn:
    """Every rank (collective): after each wrote its part of the stop's checkpoint into ``saved``
    (``problem``: why its write failed, None if it did not), the first problem of any rank as an
    ``OutputFileError`` on every rank (the run cannot resume), else ``StoppedEarly``. ``comm`` is
    an mpi4py communicator, not imported here: the launcher uses this module before MPI starts."""
    problem = next(filter(None, comm.allgather(problem)), None)
    if problem is not None:
        raise OutputFileError(f"{problem} (a stop signal came: the run stopped after {unit} {done} and cannot "
                              "resume from it)")
    raise StoppedEarly(done, saved, requests.seen, unit=unit)
