"""What a signal to ``hpcreduce launch`` does to the job: its exit status tells how the job ended,
and the job never outlives the launcher, whichever signal came (SIGKILL too)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcreduce.runtime.jobs import stop_job
from mpi_run import CHECKOUT_FIRST, LAUNCHER_DID_NOT_START

TIMEOUT = 60
# Each rank writes its pid once every rank is in MPI, then waits: no stop handling of its own.
LOOP = ("import os, time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
        "open(os.path.join({folder!r}, 'pid' + str(MPI.COMM_WORLD.rank)), 'w').write(str(os.getpid())); "
        "time.sleep(120)")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def signalled_launch(folder, sig, *flags, env=None):
    """``hpcreduce launch -n 2 FLAGS -- python LOOP``, sent ``sig`` once both ranks run; (launcher's
    exit code, its output, the ranks' pids, seconds from the signal until no rank was left). A
    launch whose mpirun did not start (``LAUNCHER_DID_NOT_START``) is run once more, as ``run_job``'s."""
    for attempt in (1, 2):
        started = _signalled_launch(folder, sig, *flags, env=env)
        if attempt == 2 or started[2] or not any(text in started[1] for text in LAUNCHER_DID_NOT_START):
            break
    assert len(started[2]) == 2, started[1]
    return started


def _signalled_launch(folder, sig, *flags, env=None):
    child = subprocess.Popen([sys.executable, "-m", "hpcreduce", "launch", "-n", "2", *flags, "--", "python", "-c",
                              LOOP.format(folder=str(folder))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True, env={**os.environ, **CHECKOUT_FIRST, **(env or {})})
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(list(folder.glob("pid*"))) < 2 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        time.sleep(0.2)  # both pids written in full
        ranks = [int(path.read_text()) for path in folder.glob("pid*")]
        child.send_signal(sig)
        sent = time.monotonic()
        while any(map(alive, ranks)) and time.monotonic() < sent + TIMEOUT:
            time.sleep(0.05)
        gone_after = time.monotonic() - sent
        output, _ = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hpcreduce launch did not end within {TIMEOUT} s (a hang is a bug)")
    finally:
        stop_job(child, 0)
        for pid in (int(path.read_text() or 0) for path in folder.glob("pid*")):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    return child.returncode, output, ranks, gone_after


def test_an_ft_job_killed_by_its_stop_signal_is_not_reported_done(tmp_path):
    """Under ULFM mpirun exits 0 although SIGUSR1 killed every rank (a script without stop
    handling): the launch says the job did not finish, 128 + SIGUSR1, as without --ft."""
    code, output, _, _ = signalled_launch(tmp_path, signal.SIGUSR1, "--ft")
    assert code == 128 + signal.SIGUSR1 and "the job did not say it finished" in output, output
    (tmp_path / "plain").mkdir()
    plain, output, _, _ = signalled_launch(tmp_path / "plain", signal.SIGUSR1)
    assert plain == 128 + signal.SIGUSR1, output


@pytest.mark.parametrize("signals, sig", [("none", signal.SIGUSR1), ("USR2", signal.SIGUSR1),
                                          ("USR1", signal.SIGHUP), ("USR1", signal.SIGKILL)])
def test_a_signal_that_ends_the_launcher_ends_the_job(tmp_path, signals, sig):
    """A signal that is no stop signal ends the job with the launcher, which exits 128 + it; a
    launcher killed outright takes mpirun and the ranks with it."""
    code, output, ranks, gone_after = signalled_launch(tmp_path, sig, "--ft",
                                                       env={"HPCREDUCE_STOP_SIGNALS": signals})
    assert not any(map(alive, ranks)) and gone_after < 30, (ranks, output)
    assert code == (-sig if sig == signal.SIGKILL else 128 + sig), output
