"""Bad flags, settings and paths refused up front; restarts that stop on a user's signal and
never rerun a finished job; growth past the slots; results of the wrong kind.

Most cases are refusals that never start MPI (fast); the few jobs are 2 ranks.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hpcreduce.runtime.launch import LaunchPlan, build_mpirun, run_plan
from mpi_run import hpcreduce_cli, run_job

BAD_TRAIN = {  # flags -> what the refusal says (each printed once)
    ("--kill", "7@5"): "--kill 7@5: no rank has id 7",
    ("--kill", "1@500"): "--kill 1@500: STEP must be from 1 to 200 (--steps)",
    ("--kill", "1@10:checkpoint"): "--kill 1@10:checkpoint: no checkpoint is written at step 10",
    ("--kill", "2@6:recovery"): "--kill 2@6:recovery: no recovery can happen at step 6",
    ("--grow", "1@500"): "--grow 1@500: STEP must be from 1 to 200",
    ("--lr", "inf"): "--lr must be positive and finite, got inf",
    ("--json", "same.json", "--timeline", "same.json"): "--json and --timeline name one file",
    ("--restarts", "-1"): "--restarts must be 0 or more, got -1",
    ("--checkpoint-dir", "a-file"): "--checkpoint-dir a-file: is a file, not a folder",
}


def assert_refused(job, *messages, prefix="hpcreduce train: "):
    assert job.returncode == 2, job
    assert "Traceback" not in job.output and "mpirun" not in job.output, job  # nothing launched
    for message in messages:
        assert job.output.count(prefix + message) == 1, (message, job.output)


def test_train_refuses_every_bad_flag_at_once_before_launching(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    args = [arg for flags in BAD_TRAIN for arg in flags]
    job = hpcreduce_cli("train", "-n", "3", "--ft", *args, timeout=60, cwd=str(tmp_path))
    assert_refused(job, *BAD_TRAIN.values())
    assert not (tmp_path / "same.json").exists()


ALONE = {  # a flag that does nothing without a partner -> the partner the refusal names
    ("--eviction", "lfu"): "--row-budget", ("--checkpoint-keep", "3"): "--checkpoint-dir",
    ("--checkpoint-every", "5"): "--checkpoint-dir", ("--discover-every", "2"): "--discover",
    ("--max-ranks", "8"): "--discover",
    ("--kill-seed", "1"): "--kill-random", ("--accept-server-loss",): "in-job fault tolerance: launch with ULFM (--ft)",
    ("--leave", "2@5"): "in-job fault tolerance: launch with ULFM (--ft)",
}


def test_a_flag_given_without_the_flag_it_needs_is_refused_by_name():
    args = [arg for flags in ALONE for arg in flags]
    job = hpcreduce_cli("train", "-n", "3", "--mode", "ps", "--model", "embed", *args, timeout=60)
    assert_refused(job, "--eviction needs --row-budget", "--checkpoint-every and --checkpoint-keep need "
                   "--checkpoint-dir", "--max-ranks and --discover-every need --discover", "--kill-seed needs --kill-random",
                   "--leave and --accept-server-loss need in-job fault tolerance: launch with ULFM (--ft)")


def test_every_declared_partner_is_a_setting_and_every_flag_with_one_is_refused_alone():
    from hpcreduce.ft.faults import FT, FaultConfig
    from hpcreduce.runtime.options import declared
    from hpcreduce.train.config import TOPOLOGIES, TrainConfig
    needing = set()
    for cls in (TrainConfig, FaultConfig, *TOPOLOGIES.values()):
        names = {f.name for f, _ in declared(cls)}
        for f, option in declared(cls):
            assert set(option.needs) <= names | {FT}, (cls, f.name, option.needs)  # a typo would check nothing
            needing |= {option.flag} if option.needs else set()
    assert needing - {flags[0] for flags in ALONE} == {"--grow", "--grow-servers", "--discover", "--replace"}


@pytest.mark.parametrize("env, message", [
    ({"HPCREDUCE_DEADLINE": "abc"}, "HPCREDUCE_DEADLINE='abc' is not a number of seconds"),
    ({"HPCREDUCE_FUSION_BYTES": "abc"}, "HPCREDUCE_FUSION_BYTES='abc' is not a number of bytes"),
    ({"HPCREDUCE_AUTO_TABLE": "inf:bogus"}, "HPCREDUCE_AUTO_TABLE='inf:bogus' is not a table"),
    ({"HPCREDUCE_SPAWN_INFO": "map_by"}, "HPCREDUCE_SPAWN_INFO='map_by' is not spawn info as key=value;key=value "
                                         "('map_by' needs a key and a value"),  # MPI refused it at the first growth
])
def test_bad_settings_are_refused_like_flags(env, message):
    assert_refused(hpcreduce_cli("train", "-n", "2", timeout=60, env=env), message)
    assert_refused(hpcreduce_cli("bench", "allreduce", "-n", "2", timeout=60, env=env), message,
                   prefix="hpcreduce bench allreduce: ")
    assert_refused(hpcreduce_cli("launch", "-n", "2", "--", "true", timeout=60, env=env), message,
                   prefix="hpcreduce launch: ")


def test_under_mpirun_itself_every_rank_exits_and_rank_0_alone_says_why():
    plan = build_mpirun(2, [sys.executable, "-m", "hpcreduce", "train", "--lr", "nan", "--kill", "5@3"])
    job = run_job(plan.argv, timeout=60, env={**plan.env, "HPCREDUCE_DEADLINE": "-1"})
    assert job.returncode == 2 and "Traceback" not in job.output, job
    for message in ("--lr must be positive and finite, got nan", "--kill 5@3: no rank has id 5",
                    "HPCREDUCE_DEADLINE='-1' is not"):
        assert job.output.count(message) == 1, (message, job.output)


def test_bench_flags_and_paths_are_refused_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_refused(hpcreduce_cli("bench", "ps", "-n", "2", "--rounds", "0", "--width", "-1", timeout=60),
                   "--rounds must be at least 1, got 0", "--width must be at least 1, got -1",
                   prefix="hpcreduce bench ps: ")
    assert_refused(hpcreduce_cli("bench", "recovery", "--counts", "abc", "--repeats", "0", timeout=60),
                   "--counts must be rank counts of at least 2", "--repeats must be at least 1",
                   prefix="hpcreduce bench recovery: ")
    assert_refused(hpcreduce_cli("bench", "allreduce", "-n", "2", "--json", f"{blocker}/x.json", timeout=60),
                   f"--json {blocker}/x.json:", prefix="hpcreduce bench allreduce: ")
    assert_refused(hpcreduce_cli("bench", "scaling", "--out", str(blocker), timeout=60),
                   f"--out {blocker}:", prefix="hpcreduce bench scaling: ")
    job = hpcreduce_cli("bench", "allreduce", "--sizes", "inf", timeout=60)
    assert job.returncode == 2 and "'inf' is not a list of sizes" in job.output and "Traceback" not in job.output


def test_report_names_what_a_result_of_the_wrong_kind_lacks(tmp_path):
    path = tmp_path / "scaling.json"
    path.write_text(json.dumps({"benchmark": "scaling", "rows": [], "cores": 2}))
    job = hpcreduce_cli("report", str(path), timeout=60)
    assert job.returncode == 1 and "Traceback" not in job.output, job
    assert "a scaling result needs" in job.output and "lacks model, scaling, predictions" in job.output


def test_growth_past_the_slots_is_refused_up_front_and_a_failed_spawn_is_clear_on_every_rank(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    env = {"HPCREDUCE_SPAWN_INFO": "map_by=slot"}  # no oversubscribe: spawned ranks need free slots
    grow = ["train", "--ft", "--grow", "1@3", "--steps", "6", "--quiet"]
    assert_refused(hpcreduce_cli(*grow, "-n", "2", "--hostfile", str(hostfile), timeout=60, env=env),
                   "--grow/--grow-servers take the job to 3 ranks, past the 2 slots of --hostfile")
    plan = build_mpirun(2, [sys.executable, "-m", "hpcreduce", *grow], ft=True, hostfile=str(hostfile))
    job = run_job(plan.argv, timeout=90, env={**plan.env, **env})
    assert job.returncode != 0 and "Traceback" not in job.output, job
    assert job.output.count("cannot start 1 more rank(s): MPI_Comm_spawn failed") == 2, job.output


def attempts_plan(tmp_path, code):
    """A job that counts its attempts in a file, marks itself done, then exits ``code``."""
    script = ("import sys; from hpcreduce.runtime.launch import mark_done; "
              f"open({str(tmp_path / 'attempts')!r}, 'a').write('x'); mark_done(); sys.exit({code})")
    return LaunchPlan([sys.executable, "-c", script])


def test_a_finished_job_is_not_rerun_when_mpirun_fails_after_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_plan(attempts_plan(tmp_path, 137), restarts=2, echo=False) == 0
    assert (tmp_path / "attempts").read_text() == "x"
    unmarked = LaunchPlan([sys.executable, "-c", f"open({str(tmp_path / 'n')!r}, 'a').write('x'); exit(3)"])
    assert run_plan(unmarked, restarts=2, echo=False) == 3 and (tmp_path / "n").read_text() == "xxx"
    assert [p for p in os.listdir(tmp_path) if p.startswith(".hpcreduce-launch-")] == []  # markers cleaned


def test_an_exit_0_without_rank_0s_done_marker_is_a_job_that_did_not_finish(tmp_path, monkeypatch, capsys):
    """hpcreduce's own commands mark their end (``expects_done``): an mpirun that exits 0 without it
    (Open MPI after a lost daemon) is relaunched, and after the last attempt exits 1, saying why."""
    monkeypatch.chdir(tmp_path)
    unmarked = LaunchPlan([sys.executable, "-c", f"open({str(tmp_path / 'n')!r}, 'a').write('x')"])
    assert run_plan(unmarked, restarts=1, echo=False) == 0  # any other program: its exit code
    assert run_plan(unmarked, restarts=1, echo=False, expects_done=True) == 1
    assert (tmp_path / "n").read_text() == "xxx"
    err = capsys.readouterr().err
    assert "mpirun exited 0 but rank 0 never marked the job done; restart 1 of 1" in err, err
    assert err.count("mpirun exited 0 but rank 0 never marked the job done") == 2, err
    assert run_plan(attempts_plan(tmp_path, 0), restarts=1, echo=False, expects_done=True) == 0


def test_a_launcher_that_stays_up_after_the_job_marked_itself_done_is_ended(tmp_path, monkeypatch, capsys):
    """Open MPI's mpirun has stayed up after spawned ranks on several nodes: a job marked done is
    ended after the grace period, and counts as finished (not rerun)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hpcreduce.runtime.launch.DONE_GRACE_S", 1.0)
    script = ("import time; from hpcreduce.runtime.launch import mark_done; "
              f"open({str(tmp_path / 'attempts')!r}, 'a').write('x'); mark_done(); time.sleep(600)")
    started = time.monotonic()
    assert run_plan(LaunchPlan([sys.executable, "-c", script]), restarts=1, echo=False) == 0
    assert time.monotonic() - started < 60 and (tmp_path / "attempts").read_text() == "x"
    assert "marked itself done 1 s ago but mpirun is still up; ending it" in capsys.readouterr().err


def test_a_launcher_that_stays_up_after_a_rank_aborted_the_job_is_ended_with_the_ranks_code(tmp_path, monkeypatch,
                                                                                          capsys):
    """Open MPI's mpirun has stayed up after an MPI_Abort in a job that had spawned ranks: a rank
    that aborts marks it (``abort_job``), and the launcher ends mpirun soon after, exiting its code."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hpcreduce.runtime.launch.ABORT_GRACE_S", 1.0)
    script = "import time; from hpcreduce.runtime.launch import mark_aborted; mark_aborted(4); time.sleep(600)"
    started = time.monotonic()
    assert run_plan(LaunchPlan([sys.executable, "-c", script]), echo=False, expects_done=True) == 4
    assert time.monotonic() - started < 30
    assert "the job was aborted 1 s ago but mpirun is still up; ending it" in capsys.readouterr().err


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 128 + signal.SIGUSR1), (signal.SIGINT, 130)])
def test_a_signal_to_the_launcher_stops_the_job_without_a_relaunch(tmp_path, signum, code):
    launcher = subprocess.Popen([sys.executable, "-m", "hpcreduce", "train", "-n", "2", "--restarts", "2",
                                 "--steps", "1000000", "--progress", "lines"], cwd=str(tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, started = [], threading.Event()

    def read():
        for line in launcher.stdout:
            lines.append(line)
            if line.startswith("hpcreduce train: logreg"):
                started.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(60), "".join(lines)
        sent = time.monotonic()
        launcher.send_signal(signum)  # to the launcher alone, as a scheduler's stop does (SIGTERM: a stop
        # signal, the ranks stop at a step boundary; no checkpoint folder: 128 + SIGUSR1, runtime.stop)
        assert launcher.wait(timeout=30) == code, "".join(lines)
        assert time.monotonic() - sent < 30
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    reader.join(5)
    output = "".join(lines)
    assert "restart 1 of 2" not in output and f"stopped by {signal.Signals(signum).name}" in output, output
    assert output.count("hpcreduce train: logreg") == 1, output  # one attempt, not relaunched
