"""A rank SIGKILLed while the job grows: during ``--grow``'s spawn, ``--replace``'s and ``--grow-servers``'
(spawn, split and rebalance). Open MPI 5.0.11 cannot recover from it (the spawn's root never returns
once a parent died during it; a revoke does not interrupt it), so the promise kept is the other one:
every rank that sees the failure ends with one clear error at once (``runtime.failures.fatal_failures``),
the job ends well within the deadline, mpirun and the launcher exit non-zero, and nothing is left running.

The kill is real and timed from outside: the victim (a rank of the launched job) is SIGKILLed as
soon as a spawned rank appears (a process of a second PMIx namespace), while its parents wait in
the spawn for it to start.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcreduce.runtime import jobs
from multinode import processes_naming

DEADLINE_S = 60  # the job must end well before it: at once, within the abort grace (5 s)
TIMEOUT = 150


def ranks_of(marker):
    """{pid: (PMIx namespace, rank)} of the processes whose command line holds ``marker``."""
    found = {}
    for name in (name for name in os.listdir("/proc") if name.isdigit()):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                if marker.encode() not in cmdline.read():
                    continue
            with open(f"/proc/{name}/environ", "rb") as environ:
                env = dict(item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK" in env:
            found[int(name)] = (env.get(b"PMIX_NAMESPACE", b""), int(env[b"OMPI_COMM_WORLD_RANK"]))
    return found


def kill_when_spawning(process, marker, victim):
    """SIGKILL launch rank ``victim`` once a spawned rank exists; False when the job ended first."""
    first = None
    while process.poll() is None:
        ranks = ranks_of(marker)
        spaces = {space for space, _ in ranks.values()}
        first = first or min(spaces, default=None)  # the launched job's namespace: @1, before any spawn's
        if len(spaces) > 1:
            for pid, (space, rank) in ranks.items():
                if space == first and rank == victim:
                    os.kill(pid, signal.SIGKILL)
                    return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("ranks, victim, flags, what", [
    (3, 1, ("--grow", "2@8"), "a rank died during the growth at step 8 (spawning 2 rank(s))"),
    (3, 1, ("--kill", "2@6", "--replace"), "a rank died during the replacement at step 6 (spawning 1 rank(s))"),
    (5, 3, ("--mode", "ps", "--servers", "2", "--grow-servers", "1@8"), "a rank died during server growth"),
], ids=["grow", "replace", "grow-servers"])
def test_a_rank_killed_while_the_job_grows_ends_it_with_one_clear_error(tmp_path, ranks, victim, flags, what):
    output = tmp_path / "output.txt"
    marker = str(tmp_path / "result.json")
    argv = [sys.executable, "-m", "hpcreduce", "train", "-n", str(ranks), "--ft", *flags, "--steps", "30",
            "--batch", "512", "--progress", "none", "--deadline", str(DEADLINE_S), "--json", marker]
    started = time.monotonic()
    with open(output, "wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        killed = kill_when_spawning(process, marker, victim)
        code = process.wait(timeout=TIMEOUT)
    finally:
        jobs.stop_job(process, grace=0)
    took, text = time.monotonic() - started, output.read_text()
    assert killed, f"the job ended before it grew:\n{text}"
    assert code == 4 and took < DEADLINE_S / 2, (code, took, text)  # at once, not at the deadline
    assert "hpcreduce: rank " in text and what in text and "Traceback" not in text, text
    assert "no free slot" not in text and "DeadlineExceededError" not in text, text
    time.sleep(0.5)
    assert processes_naming(str(tmp_path)) == [], f"the job outlived its launcher:\n{text}"
