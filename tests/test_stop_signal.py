"""Stop signals outside Slurm (issue 37): a SIGUSR1 to ``hpcreduce train``'s launcher stops the
ring at a step boundary on every rank, checkpoints and exits 75; started again over the folder
the run goes on and ends with the same checksum as one never stopped (also with 3 ranks); so do PS-BSP and hybrid-BSP runs
(stopped at a step boundary twice, with --ft and without, checkpointed, resumed); a torch loop
in ``elastic.run(on_stop=...)`` stopped by one rank's signal resumes like one process. Bad input:
no checkpoint folder, a folder that cannot take the checkpoint.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcreduce.runtime.jobs import stop_job
from hpcreduce.runtime.stop import RESUMABLE_EXIT, StopRequests, StoppedEarly, parse_signals, relayed
from mpi_run import MPI_SCRIPTS, hpcreduce_cli

RING = ("train", "-n", "2", "--steps", "30", "--batch", "512", "--table-rows", "4096", "--quiet")
TIMEOUT = 120


def test_signal_names_parse_and_a_second_signal_changes_nothing():
    assert parse_signals("usr1, SIGTERM") == (signal.SIGUSR1, signal.SIGTERM)
    assert parse_signals("none") == ()
    with pytest.raises(ValueError, match="USR1, USR2, TERM, INT or none"):
        parse_signals("KILL")
    assert relayed(signal.SIGTERM, (signal.SIGTERM, signal.SIGUSR2)) == signal.SIGUSR2
    assert relayed(signal.SIGUSR1, ()) == signal.SIGUSR1
    requests = StopRequests()
    requests.install((signal.SIGUSR2,))
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)
        assert requests.seen == signal.SIGUSR2
    finally:
        requests.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    assert StoppedEarly(3, "ckpt", signal.SIGUSR1).code == RESUMABLE_EXIT
    assert StoppedEarly(3, None, signal.SIGUSR1).code == 128 + signal.SIGUSR1


def test_a_ps_worker_finishes_the_step_it_read_and_hybrid_checkpoints_need_the_dense_replica(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import numpy as np
    from mpi4py import MPI

    from hpcreduce.runtime import stop
    from hpcreduce.train.ps import dense_checkpoints, shard_checkpoints, stop_point
    point = stop_point.StopPoint(MPI.COMM_SELF, [0])  # the first (and only) worker
    assert not point.after_read(3) and point.at is None  # no signal: nothing named, nothing sent
    monkeypatch.setattr(stop.requests, "seen", signal.SIGUSR1)
    assert not point.after_read(4) and point.at == 5  # the signal during step 5: that step is finished
    assert point.after_read(5) and stop_point.agreed([point.vote(5)]) == 5  # and the loop stops before step 6
    replica = SimpleNamespace(params={"w": np.arange(4.0)}, state={"w": {"sum": np.ones(4)}}, applied=5)
    dense_checkpoints.save_when_due(str(tmp_path), 7, replica, 0, 3, 0, {"run": 1}, 2)  # step 6 done: due
    dense_checkpoints.save_when_due(str(tmp_path), 7, replica, 1, 3, 0, {"run": 1}, 2)  # not the first worker
    assert os.listdir(tmp_path / "dense-replica") == ["ckpt-000000006.npz"]
    loaded = SimpleNamespace(params={"w": np.zeros(4)}, state={"w": {"sum": np.zeros(4)}}, applied=0)
    dense_checkpoints.load_dense(str(tmp_path), 6, loaded)
    assert loaded.applied == 6 and loaded.params["w"].tolist() == [0, 1, 2, 3] and loaded.state["w"]["sum"].all()
    assert shard_checkpoints.latest_complete(str(tmp_path)) is None  # no shard wrote it


def stopped_run(args, metrics, signals=(signal.SIGUSR1,), after_steps=3, before=lambda: None):
    """Run ``hpcreduce train`` and send it ``signals`` once ``metrics`` has ``after_steps`` lines
    (``before()`` first); (exit code, output)."""
    child = subprocess.Popen([sys.executable, "-m", "hpcreduce", *args, "--metrics", str(metrics)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env={**os.environ, "OMPI_MCA_mpi_yield_when_idle": "1"})
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and child.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= after_steps:
                before()
                for sig in signals:
                    child.send_signal(sig)
                    time.sleep(0.05)
                break
            time.sleep(0.05)
        output, _ = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop_job(child, 0)
        raise AssertionError(f"hpcreduce train did not end within {TIMEOUT} s (a hang is a bug)")
    return child.returncode, output


def stopped_at(code, output) -> int:
    """The step a run stopped by SIGUSR1 stopped after (and checkpointed)."""
    assert code == RESUMABLE_EXIT and "stopped by SIGUSR1 after step" in output, output
    return int(output.split("stopped by SIGUSR1 after step ")[1].split(";")[0])


def test_a_stopped_and_resumed_ring_run_ends_like_one_never_stopped(tmp_path):
    whole = tmp_path / "whole.json"
    done = hpcreduce_cli(*RING, "--json", str(whole), timeout=TIMEOUT)
    assert done.returncode == 0, done.output
    folder, out = tmp_path / "ckpt", tmp_path / "resumed.json"
    slowed = [*RING, "--checkpoint-dir", str(folder), "--slow", "0:20", "--json", str(out)]
    # the signal lands mid-run; sent twice: the second changes nothing
    first = stopped_at(*stopped_run(slowed, tmp_path / "m1.jsonl", (signal.SIGUSR1, signal.SIGUSR1)))
    assert 3 <= first < 30 and os.listdir(folder) == [f"ckpt-{first:09d}.npz"], os.listdir(folder)
    assert not out.exists()  # no result for a run that did not finish
    again = hpcreduce_cli(*RING, "--checkpoint-dir", str(folder), "--json", str(out), timeout=TIMEOUT)
    assert again.returncode == 0, again.output
    assert f"resumed from the checkpoint of step {first} (written by 2 ranks, now 2)" in again.output
    reference, resumed = json.loads(whole.read_text()), json.loads(out.read_text())
    assert resumed["recovery"][0]["kind"] == "resume" and resumed["recovery"][0]["step"] == first + 1
    assert resumed["recovery"][0]["requeued"] == 0  # not under Slurm
    assert resumed["final"] == reference["final"]  # bit for bit: the same steps, the same sums
    # started again with another number of ranks: the ring resumes with the new size
    other = hpcreduce_cli(RING[0], "-n", "3", *RING[3:], "--checkpoint-dir", str(folder), "--json", str(out),
                          timeout=TIMEOUT)
    assert other.returncode == 0 and "(written by 2 ranks, now 3)" in other.output, other.output
    resized = json.loads(out.read_text())["final"]["checksum"]
    assert resized == pytest.approx(reference["final"]["checksum"], rel=1e-6)  # other summation order


def test_without_a_checkpoint_folder_the_run_stops_saying_nothing_was_saved(tmp_path):
    # a SIGTERM to the launcher reaches the ranks as SIGUSR1 (mpirun would end them on a SIGTERM)
    code, output = stopped_run([*RING, "--slow", "0:20"], tmp_path / "m.jsonl", (signal.SIGTERM,))
    assert code == 128 + signal.SIGUSR1 and "stopped by SIGUSR1 after step" in output, output
    assert "no checkpoint folder, nothing saved: the run cannot resume" in output, output


def test_a_checkpoint_that_cannot_be_written_at_the_signal_is_an_error_on_every_rank(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()

    def lose_the_folder():  # a file where the folder was: any write into it fails
        for name in os.listdir(folder):
            os.remove(folder / name)
        folder.rmdir()
        folder.write_text("not a folder")
    code, output = stopped_run([*RING, "--checkpoint-dir", str(folder), "--slow", "0:20"], tmp_path / "m.jsonl",
                               before=lose_the_folder)
    assert code == 1, output
    assert output.count("cannot resume from it") == 2, output  # both ranks, the same error


def test_an_elastic_torch_loop_stopped_by_one_rank_resumes_like_one_process(tmp_path):
    folder = tmp_path / "ckpt"
    script = ("launch", "-n", "2", "--ft", "--", sys.executable, str(MPI_SCRIPTS / "stop_elastic_torch.py"),
              str(folder))
    stopped = hpcreduce_cli(*script, "3", timeout=TIMEOUT)  # rank 1 alone gets SIGUSR1 at step 3
    assert stopped.returncode == RESUMABLE_EXIT, stopped.output
    assert "stopped by a stop signal after commit" in stopped.output, stopped.output
    saved = sorted(os.listdir(folder))
    assert len(saved) == 1 and saved[0] in ("ckpt-000000002.pt", "ckpt-000000003.pt"), saved
    resumed = hpcreduce_cli(*script, "-1", timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.output
    step = int(saved[0][5:14])
    assert f"started at step {step} (checkpoint {step})" in resumed.output, resumed.output
    assert "ok every_sample_once" in resumed.output and "ok equals_one_process_run" in resumed.output


@pytest.mark.parametrize("mode,ft", [("ps", (False, True, True)), ("hybrid", (True, False, False))])
def test_a_bsp_run_stopped_twice_with_ft_or_without_resumes_to_the_same_checksum(tmp_path, mode, ft):
    """Stopped, resumed and stopped again, then finished: each launch with ``--ft`` or not as ``ft``
    says (ps: first without, then with; hybrid: the other way round)."""
    run = ("train", "-n", "3", "--mode", mode, "--servers", "1", "--steps", "20", "--batch", "256",
           "--table-rows", "4096", "--quiet")
    whole = hpcreduce_cli(*run, "--json", str(tmp_path / "whole.json"), timeout=TIMEOUT)
    assert whole.returncode == 0, whole.output
    reference = json.loads((tmp_path / "whole.json").read_text())["final"]
    folder, out = tmp_path / "ckpt", tmp_path / "resumed.json"
    saving = (*run, "--checkpoint-dir", str(folder), "--checkpoint-every", "5", "--json", str(out))
    flag = lambda launch: ("--ft",) if ft[launch] else ()  # noqa: E731
    first = stopped_at(*stopped_run([*saving, *flag(0), "--slow", "1:50"], tmp_path / "m0.jsonl"))
    assert 3 <= first < 14 and not out.exists()
    assert f"ckpt-{first:09d}.npz" in os.listdir(folder / "ps-shard-0")  # the servers' shards, at the stop
    if mode == "hybrid":
        assert f"ckpt-{first:09d}.npz" in os.listdir(folder / "dense-replica")  # the workers' dense parameters
    stopped = stopped_run([*saving, *flag(1), "--slow", "1:50"], tmp_path / "m1.jsonl")
    assert f"resumed from the checkpoint of step {first} " in stopped[1], stopped[1]
    second = stopped_at(*stopped)
    assert first < second < 20 and not out.exists()
    again = hpcreduce_cli(*saving, *flag(2), timeout=TIMEOUT)
    assert again.returncode == 0 and f"resumed from the checkpoint of step {second} " in again.output, again.output
    assert "0 acknowledged updates lost" in again.output, again.output
    assert json.loads(out.read_text())["final"] == reference
