"""A lost node: the Open MPI daemon (``prted``) of node2 of two "nodes" on this host (``multinode``)
SIGKILLed while the job runs, as when that machine goes down.

Measured with Open MPI 5.0.11 (PRRTE): ULFM does not survive it. mpirun prints "PRTE has lost
communication with a remote daemon ... on node node2 ... will terminate the job", ends the job and
exits 0 (node2's ranks, ULFM's survivors, ran on). The launcher reads that text and takes an exit 0
without rank 0's done-marker for a job that did not finish: it relaunches under ``--restarts``
(resuming from the checkpoint), else ends non-zero naming the node, and kills what outlived mpirun.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcreduce.runtime import jobs
from hpcreduce.runtime.mpirun_output import LostDaemons
from mpi_run import DAEMON_DID_NOT_START
from multinode import daemon_of, nodes, processes_naming

TIMEOUT = 150
NODE_DIED = b"""--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-vm-19378@0,0] on node vm
  Remote daemon: [prterun-vm-19378@0,2] on node node2

This is usually due to either a failure of the TCP network
"""
NO_REPORT = b"""A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    vm
  Remote host:   gpu-07.cluster
  Daemon exit status: 0
"""


@pytest.mark.parametrize("text, nodes_named", [(NODE_DIED, ["node2"]), (NO_REPORT, ["gpu-07.cluster"]),
                                              (b"An PRTE daemon has unexpectedly failed after launch", []),
                                              (b"rank 3: loss 0.4 lost communication? no", None)])
def test_mpiruns_lost_daemon_texts_are_read_even_when_cut_between_reads(text, nodes_named):
    for cut in (1, len(text) // 2, len(text) - 3):
        lost = LostDaemons()
        for chunk in (b"x" * 5000 + text[:cut], text[cut:], b"y" * 100):
            lost.feed(chunk)
        assert (lost.nodes if lost.seen else None) == nodes_named, cut


def launch(tmp_path, two, *args):
    """``hpcreduce`` with ``args`` on the two nodes, its output to a file; (process, output file)."""
    output = tmp_path / "output.txt"
    with open(output, "wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "hpcreduce", *args], stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=str(tmp_path), start_new_session=True,
                                   env={**os.environ, **two.env})
    return process, output


def kill_daemon_when(ready, process, output, node="node2"):
    """SIGKILL ``node``'s daemon once ``ready()`` holds and the daemon runs ranks; False if the launcher ended first."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        daemon = daemon_of(node) if ready() else None
        if daemon:
            os.kill(daemon, signal.SIGKILL)
            return True
        time.sleep(0.2)
    if process.poll() is None:
        raise AssertionError(f"{node}'s daemon never ran ranks while the job was up:\n{output.read_text()}")
    return False


def launch_and_kill_daemon(tmp_path, two, ready, *args, again=True):
    """``launch`` then ``kill_daemon_when(ready)``; a job whose daemons did not start
    (``DAEMON_DID_NOT_START``, no rank ran) starts once more, saying so. (process, output file)."""
    process, output = launch(tmp_path, two, *args)
    if kill_daemon_when(ready, process, output):
        return process, output
    jobs.stop_job(process, grace=0)
    text = output.read_text()
    if not again or DAEMON_DID_NOT_START not in text or ready():
        raise AssertionError(f"the launcher ended (exit {process.returncode}) before node2's daemon ran ranks:\n{text}")
    print(f"test_lost_daemon: mpirun's daemons did not start ({DAEMON_DID_NOT_START}); starting it once more",
          file=sys.stderr)
    return launch_and_kill_daemon(tmp_path, two, ready, *args, again=False)


def ended(process, output, tmp_path):
    """The launcher's exit code and output, once it ended by itself; nothing of the job may be left."""
    try:
        code = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        jobs.stop_job(process, grace=0)
    text = output.read_text()
    assert code is not None, f"the launcher hung after the daemon loss:\n{text}"
    time.sleep(0.5)
    assert processes_naming(str(tmp_path)) == [], f"the job outlived its launcher:\n{text}"
    return code, text


@pytest.mark.parametrize("mode", [(), ("--mode", "ps", "--servers", "2")], ids=["ring", "ps"])
def test_a_lost_daemon_under_ft_ends_the_job_non_zero_naming_the_node(tmp_path, mode):
    two = nodes(tmp_path, [2, 2])
    result = tmp_path / "result.json"
    output = tmp_path / "output.txt"
    process, output = launch_and_kill_daemon(
        tmp_path, two, lambda: "hpcreduce train: logreg" in output.read_text(), "train", "-n", "4", "--hostfile",
        two.hostfile, "--ft", *mode, "--steps", "100000", "--batch", "256", "--progress", "none", "--json", str(result))
    code, text = ended(process, output, tmp_path)
    assert code == 1, text
    assert "hpcreduce: the job did not finish: mpirun lost the daemon of node(s) node2 and exited 0" in text, text
    assert "final:" not in text and not result.exists(), text


def test_a_lost_daemon_without_ft_is_relaunched_from_the_checkpoint(tmp_path):
    two = nodes(tmp_path, [2, 2])
    result, folder = tmp_path / "result.json", tmp_path / "ckpt"
    process, output = launch_and_kill_daemon(
        tmp_path, two, lambda: folder.is_dir() and any(folder.glob("ckpt-*.npz")), "train", "-n", "4", "--hostfile",
        two.hostfile, "--steps", "80", "--batch", "256", "--checkpoint-dir", str(folder), "--checkpoint-every", "20",
        "--restarts", "2", "--progress", "none", "--json", str(result))
    code, text = ended(process, output, tmp_path)
    assert code == 0, text
    assert "mpirun lost the daemon of node(s) node2 and exited 0; restart 1 of 2" in text, text
    data = json.loads(result.read_text())
    (resume,) = [event for event in data["recovery"] if event["kind"] == "resume"]
    assert resume["step"] > 20 and data["steps"][-1]["step"] == 80 and "final:" in text, (resume, text)


@pytest.mark.parametrize("first_start_fails", [False, True], ids=["started", "restarted"])
def test_a_lost_daemon_under_launch_ends_non_zero_naming_the_node(tmp_path, first_start_fails):
    """``restarted``: the retry above, provoked: node2's first daemon exits 1 before it starts
    (mpirun: "A daemon failed to report back", exit 213); the second start runs, and its
    daemon's loss is seen."""
    two = nodes(tmp_path, [1, 1])
    failed = tmp_path / "failed_once"
    if first_start_fails:
        agent = Path(two.env["PRTE_MCA_plm_ssh_agent"])
        script = agent.read_text().split("\n", 1)
        agent.write_text(f"{script[0]}\nif [ ! -e {failed} ]; then touch {failed}; exit 1; fi\n{script[1]}")
    started = tmp_path / "started"
    program = f"import time; open({str(started)!r} + str(time.time()), 'w'); time.sleep(100)"
    process, output = launch_and_kill_daemon(tmp_path, two, lambda: len(list(tmp_path.glob("started*"))) == 2,
                                             "launch", "-n", "2", "--hostfile", two.hostfile, "--",
                                             "python", "-c", program)
    code, text = ended(process, output, tmp_path)
    assert failed.exists() == first_start_fails, text
    assert code == 1 and "mpirun lost the daemon of node(s) node2" in text, text
