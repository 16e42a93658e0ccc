"""Stop signals at awkward moments (issue 37), outside Slurm: a signal to the ranks in their first
second (before the trainer, before the first checkpoint could be written) is held and the run
stops resumable after its first step (the handlers come before ``python -m hpcreduce``'s heavy
imports; a held signal not in --stop-signals acts as without them); a signal during a checkpoint
write and during a recovery; a sandblaster run stops after an iteration and resumes to the same
objective; each training script in jobs/ sources the shared requeue helper and defaults CKPT_DIR.
The other edges are in tests/test_stop_signal.py.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcreduce.runtime import stop
from hpcreduce.runtime.files import TEMPORARY
from hpcreduce.runtime.jobs import stop_job
from hpcreduce.runtime.stop import RESUMABLE_EXIT, StopRequests, hold_early

from mpi_run import hpcreduce_cli
from test_stop_signal import stopped_run

RING = ("train", "-n", "2", "--steps", "30", "--batch", "512", "--table-rows", "4096", "--quiet")
TIMEOUT = 120


def ranks_of(launcher: int) -> list:
    """The pids of the ranks (``python -m hpcreduce train`` under mpirun) in ``launcher``'s session."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != launcher):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if os.getsid(pid) == launcher and b"hpcreduce" in argv and b"python" in argv[0]:
                found.append(pid)
        except OSError:  # gone meanwhile
            continue
    return found


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its /proc status's SigCgt mask)."""
    try:
        mask = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("SigCgt:"))
    except OSError:
        return False
    return bool(int(mask, 16) >> (sig - 1) & 1)


def signal_ranks_at_start(args, ranks: int, sig=signal.SIGUSR1):
    """Run ``hpcreduce train``, send ``sig`` to each of its ``ranks`` ranks as soon as all catch it
    (the first lines of ``python -m hpcreduce``); (exit code, output, seconds from start to signal)."""
    child = subprocess.Popen([sys.executable, "-m", "hpcreduce", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env={**os.environ, "OMPI_MCA_mpi_yield_when_idle": "1"})
    started = time.monotonic()
    try:
        while time.monotonic() < started + TIMEOUT and child.poll() is None:
            pids = ranks_of(child.pid)
            if len(pids) == ranks and all(catches(pid, sig) for pid in pids):
                break
            time.sleep(0.002)
        sent = time.monotonic() - started
        for pid in pids:
            os.kill(pid, sig)
        output, _ = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_job(child, 0)
        raise AssertionError(f"hpcreduce train did not end within {TIMEOUT} s (a hang is a bug)")
    return child.returncode, output, sent


def test_a_signal_in_the_ranks_first_second_is_held_until_the_first_step_is_checkpointed(tmp_path):
    folder = tmp_path / "ckpt"
    code, output, _ = signal_ranks_at_start([*RING, "--checkpoint-dir", str(folder)], 2)
    assert code == RESUMABLE_EXIT and "stopped by SIGUSR1 after step 1;" in output, output
    assert os.listdir(folder) == ["ckpt-000000001.npz"]


def test_a_rank_of_train_holds_a_signal_from_its_first_lines_and_gives_back_one_not_in_its_list(monkeypatch):
    monkeypatch.setattr(stop, "requests", StopRequests())
    monkeypatch.setenv("HPCREDUCE_STOP_SIGNALS", "USR2")
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    monkeypatch.delenv("PMI_SIZE", raising=False)
    monkeypatch.delenv("PMIX_RANK", raising=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    got = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, _frame: got.append(signum))
    try:
        hold_early(["train"])  # the launcher (outside MPI): nothing caught
        assert stop.requests.signals == ()
        monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
        hold_early(["info"])  # another command: nothing
        assert stop.requests.signals == ()
        hold_early(["train"])
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)
        assert stop.requests.seen == signal.SIGUSR2 and not got  # held
        stop.requests.install((signal.SIGUSR2,))  # --stop-signals USR2: still held
        assert stop.requests.seen == signal.SIGUSR2 and not got
        stop.requests.install((signal.SIGUSR1,))  # not in --stop-signals: to its own handler, as if never held
        time.sleep(0.01)
        assert got == [signal.SIGUSR2] and stop.requests.seen is None
    finally:
        stop.requests.uninstall()
        signal.signal(signal.SIGUSR2, previous)


def test_python_m_hpcreduce_catches_the_signals_before_its_heavy_imports():
    shown = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpcreduce", "train", "--help"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "OMPI_COMM_WORLD_SIZE": "1"})
    assert shown.returncode == 0, shown.stderr
    order = [line.split("|")[-1].strip() for line in shown.stderr.splitlines() if line.startswith("import time:")]
    assert order.index("hpcreduce.runtime.stop") < min(order.index(name) for name in ("numpy", "hpcreduce.cli"))
    setup = (Path(__file__).resolve().parent.parent / "setup.py").read_text()
    assert '"hpcreduce = hpcreduce.__main__:main"' in setup  # the installed command holds early too


def test_a_sandblaster_run_stopped_after_an_iteration_resumes_to_the_same_objective(tmp_path):
    run = ("train", "-n", "3", "--mode", "sandblaster", "--servers", "1", "--steps", "12", "--batch", "4096",
           "--table-rows", "4096", "--quiet")
    whole = hpcreduce_cli(*run, "--json", str(tmp_path / "whole.json"), timeout=TIMEOUT)
    assert whole.returncode == 0, whole.output
    folder, out = tmp_path / "ckpt", tmp_path / "out.json"
    saving = (*run, "--checkpoint-dir", str(folder), "--json", str(out))
    code, output = stopped_run([*saving, "--slow", "2:20"], tmp_path / "m.jsonl", after_steps=2)
    assert code == RESUMABLE_EXIT and "stopped by SIGUSR1 after iteration " in output, output
    stopped = int(output.split("stopped by SIGUSR1 after iteration ")[1].split(";")[0])
    assert 2 <= stopped < 12 and os.listdir(folder / "sandblaster-slice-0") == [f"ckpt-{stopped:09d}.npz"]
    again = hpcreduce_cli(*saving, timeout=TIMEOUT)
    assert again.returncode == 0 and f"resumed from the checkpoint of iteration {stopped} " in again.output, again.output
    resumed, reference = json.loads(out.read_text()), json.loads((tmp_path / "whole.json").read_text())
    assert resumed["recovery"][0]["kind"] == "resume" and resumed["recovery"][0]["step"] == stopped + 1
    assert len(resumed["steps"]) == 12 and resumed["final"] == reference["final"]
    assert resumed["sandblaster"]["objective"] == reference["sandblaster"]["objective"]


def test_a_signal_to_the_writer_during_a_checkpoint_write_lets_it_complete_and_the_resume_is_exact(tmp_path):
    """A checkpoint every step, big enough to take a while; SIGUSR1 goes to the rank writing one
    (named by its temporary file) while it writes: the write completes (atomically), the run stops
    at the next step boundary with its own checkpoint, and the resume ends like a run never stopped."""
    run = ("train", "-n", "2", "--steps", "14", "--batch", "512", "--table-rows", str(1 << 20), "--quiet")
    whole = hpcreduce_cli(*run, "--json", str(tmp_path / "whole.json"), timeout=TIMEOUT)
    assert whole.returncode == 0, whole.output
    folder, out = tmp_path / "ckpt", tmp_path / "out.json"
    saving = (*run, "--checkpoint-dir", str(folder), "--checkpoint-every", "1", "--json", str(out))
    child = subprocess.Popen([sys.executable, "-m", "hpcreduce", *saving], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env={**os.environ, "OMPI_MCA_mpi_yield_when_idle": "1"})
    writing = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while writing is None and time.monotonic() < deadline and child.poll() is None:
            names = os.listdir(folder) if folder.is_dir() else []
            writing = next((TEMPORARY.match(name) for name in names
                            if TEMPORARY.match(name) and name.startswith(".ckpt-00000000")), None)
        if writing is not None:  # the checkpoint of step 1 to 9 being written
            os.kill(int(writing.group("pid")), signal.SIGUSR1)
        output, _ = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_job(child, 0)
        raise AssertionError(f"hpcreduce train did not end within {TIMEOUT} s (a hang is a bug)")
    assert writing is not None, output
    during = int(writing.group("name")[5:14])
    assert child.returncode == RESUMABLE_EXIT and "stopped by SIGUSR1 after step " in output, output
    stopped = int(output.split("stopped by SIGUSR1 after step ")[1].split(";")[0])
    assert during <= stopped <= during + 1, (during, output)  # the step being checkpointed, or the next
    assert sorted(os.listdir(folder)) == [f"ckpt-{step:09d}.npz" for step in sorted({stopped - 1, stopped})]
    again = hpcreduce_cli(*saving, timeout=TIMEOUT)
    assert again.returncode == 0 and f"resumed from the checkpoint of step {stopped} " in again.output, again.output
    assert json.loads(out.read_text())["final"] == json.loads((tmp_path / "whole.json").read_text())["final"]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_signal_in_a_recovery_stops_after_it_and_resumes_on_more_ranks(tmp_path):
    """--ft ps: a worker is killed at step 4 and the signal comes as soon as it is gone (the others
    detect and recover meanwhile): the run recovers, then stops at a step boundary, checkpointed;
    started again on 4 ranks instead of 3 it resumes from there and ends like a run never stopped
    (up to the order of the sums: a different split of the batch)."""
    run = ("train", "--mode", "ps", "--servers", "1", "--steps", "12", "--batch", "256", "--table-rows", "4096",
           "--quiet")
    whole = hpcreduce_cli(*run, "-n", "3", "--json", str(tmp_path / "whole.json"), timeout=TIMEOUT)
    assert whole.returncode == 0, whole.output
    folder, out = tmp_path / "ckpt", tmp_path / "out.json"
    saving = (*run, "--checkpoint-dir", str(folder), "--json", str(out), "--ft")
    child = subprocess.Popen([sys.executable, "-m", "hpcreduce", *saving, "-n", "3", "--kill", "2@4", "--slow", "1:50"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env={**os.environ, "OMPI_MCA_mpi_yield_when_idle": "1"})
    try:
        deadline, pids = time.monotonic() + TIMEOUT, []
        while len(pids) < 3 and time.monotonic() < deadline and child.poll() is None:
            pids = ranks_of(child.pid)
        while all(alive(pid) for pid in pids) and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.001)
        child.send_signal(signal.SIGUSR1)
        output, _ = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_job(child, 0)
        raise AssertionError(f"hpcreduce train did not end within {TIMEOUT} s (a hang is a bug)")
    assert child.returncode == RESUMABLE_EXIT and "workers lost [2]" in output, output
    stopped = int(output.split("stopped by SIGUSR1 after step ")[1].split(";")[0])
    assert 3 <= stopped < 12 and f"ckpt-{stopped:09d}.npz" in os.listdir(folder / "ps-shard-0"), output
    again = hpcreduce_cli(*saving, "-n", "4", timeout=TIMEOUT)
    assert again.returncode == 0 and f"resumed from the checkpoint of step {stopped} " in again.output, again.output
    assert "now 1 and 3" in again.output, again.output
    reference = json.loads((tmp_path / "whole.json").read_text())["final"]["checksum"]
    assert json.loads(out.read_text())["final"]["checksum"] == pytest.approx(reference, rel=1e-6)


JOBS = Path(__file__).resolve().parent.parent / "jobs"
STUB = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\nexit ${STUB_EXIT:-0}\n'  # records, starts nothing


@pytest.mark.parametrize("script,extra", [("train_ring.sbatch", {}), ("train_ps.sbatch", {}),
                                          ("train_ft.sbatch", {"MODE": "ps"})])
def test_every_training_script_checkpoints_without_ckpt_dir_and_requeues_on_75_only(script, extra, tmp_path):
    """Each script sources jobs/requeue.sh (the copy Slurm runs lies in its spool: found from the
    job's Command), defaults CKPT_DIR by job id and requeues on exit 75, not on another code."""
    for name in ("srun", "mpirun", "scontrol"):
        (tmp_path / name).write_text(STUB)
        (tmp_path / name).chmod(0o755)
    calls = tmp_path / "calls"
    copy = tmp_path / "spool" / "slurm_script"  # as slurmd runs it: not next to jobs/requeue.sh
    copy.parent.mkdir()
    copy.write_text((JOBS / script).read_text())
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "3", "CALLS": str(calls),
           "OUT": str(tmp_path / "out.json"), "STUB_EXIT": "75", **extra}
    # scontrol show job: the stub says nothing, so the script falls back to its own folder (jobs/)
    stopped = subprocess.run(["bash", str(JOBS / script)], capture_output=True, text=True, timeout=30, env=env,
                             cwd=tmp_path)
    assert stopped.returncode == 75, stopped
    assert "CKPT_DIR is unset: checkpointing into hpcreduce-ckpt-7" in stopped.stderr, stopped.stderr
    assert "--checkpoint-dir hpcreduce-ckpt-7" in calls.read_text() and "scontrol requeue 7" in calls.read_text()
    assert "requeueing job 7 (requeued 0 time(s) before)" in stopped.stderr, stopped.stderr
    (tmp_path / "scontrol").write_text(  # the job's Command names the script submitted, in jobs/
        f'#!/bin/sh\nif [ "$1" = show ]; then echo "   Command={JOBS / script} x"; exit 0; fi\n'
        'echo "scontrol $*" >> "$CALLS"\n')
    calls.unlink()
    failed = subprocess.run(["bash", str(copy)], capture_output=True, text=True, timeout=30, cwd=tmp_path,
                            env={**env, "STUB_EXIT": "1", "CKPT_DIR": str(tmp_path / "ckpt")})
    assert failed.returncode == 1 and "CKPT_DIR is unset" not in failed.stderr, failed
    assert f"--checkpoint-dir {tmp_path / 'ckpt'}" in calls.read_text() and "requeue" not in calls.read_text()


def test_sandblaster_stop_files_round_trip_and_refuse_what_they_cannot_resume(tmp_path, monkeypatch):
    """One process: the coordinator's look for a stop, a checkpoint that cannot be written (an
    error naming it), one that can (StoppedEarly, 75), its resume (vectors and records back) and
    another run's or another K's folder refused by name."""
    from mpi4py import MPI

    from hpcreduce.errors import CheckpointMismatchError, OutputFileError
    from hpcreduce.ft.faults import FaultConfig
    from hpcreduce.runtime.stop import StoppedEarly
    from hpcreduce.sandblaster.placement import Placement
    from hpcreduce.sandblaster.protocol import VectorNames
    from hpcreduce.sandblaster.server import ServerState, SliceVectors
    from hpcreduce.train.config import Sandblaster, TrainConfig
    from hpcreduce.train.sandblaster import stop_resume

    told = stop_resume.StopTold(MPI.COMM_SELF, 0)
    assert not told.wanted()
    monkeypatch.setattr(stop.requests, "seen", signal.SIGUSR1)
    assert told.wanted()

    def config(folder, servers=1):
        return TrainConfig(steps=12, topology=Sandblaster(servers=servers), fault=FaultConfig(checkpoint_dir=folder))

    names = VectorNames(2)
    server = ServerState({0: SliceVectors(names, np.arange(5.0))})
    server.slices[0].vectors[names.G[0]] = 7.0
    server.records = [np.arange(19.0), np.arange(21.0)]
    placement, ident = Placement.initial(5, 1, replicate=False), {"mode": "sandblaster", "seed": 1}
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(OutputFileError, match="stopped after iteration 3 and cannot resume from it"):
        stop_resume.save_stop(MPI.COMM_SELF, config(str(blocked)), server, placement, ident, 3)
    folder = str(tmp_path / "ckpt")
    with pytest.raises(StoppedEarly) as stopped:
        stop_resume.save_stop(MPI.COMM_SELF, config(folder), server, placement, ident, 3)
    assert stopped.value.code == RESUMABLE_EXIT and "after iteration 3" in str(stopped.value)
    fresh = ServerState({0: SliceVectors(names, np.zeros(5))})
    records = stop_resume.resume(MPI.COMM_SELF, config(folder), ident, fresh)
    assert [len(r) for r in records] == [19, 21] and fresh.records == records
    assert (fresh.slices[0].vectors == server.slices[0].vectors).all()
    with pytest.raises(CheckpointMismatchError, match="its checkpoint of iteration 3"):
        stop_resume.resume(MPI.COMM_SELF, config(folder), {**ident, "seed": 2}, fresh)
    with pytest.raises(CheckpointMismatchError, match="checkpoints of 1 slice"):
        stop_resume.resume(MPI.COMM_SELF, config(folder, servers=2), ident, fresh)
