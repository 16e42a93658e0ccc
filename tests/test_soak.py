"""``hpcreduce bench soak``: the draws cover what the soak promises, two real runs (one PS, one ring)
pass every check end to end, the checker fails runs that break each promise, and the driver's own
faults (a SIGSTOPped rank, a node's daemon killed) are delivered and judged."""
import json
from argparse import Namespace
from dataclasses import replace

from hpcreduce.benchmarks import soak
from hpcreduce.benchmarks.soak_faults import External
from hpcreduce.benchmarks.soak_plan import CONSISTENCIES, STOP_DEADLINE, VICTIMS, SoakRun, draw_runs
from hpcreduce.cli import train_cmd
from hpcreduce.cli.main import build_parser
from hpcreduce.ft.faults import FaultConfig
from hpcreduce.ft.inject import parse_kill
from mpi_run import hpcreduce_cli

STEPS = 12


def test_the_draws_cover_every_topology_consistency_and_victim_and_every_run_is_a_valid_one():
    for seed in range(8):
        runs = draw_runs(60, seed, 6, 20)
        assert {(r.topology, r.victims) for r in runs} == {(t, v) for t, kinds in VICTIMS.items() for v in kinds}
        assert {r.consistency for r in runs if r.topology == "ps"} == set(CONSISTENCIES)
        assert "daemon" not in {r.victims for r in draw_runs(60, seed, 6, 20, nodes=False)}
        for run in runs:
            if run.hard:  # its flags as hpcreduce train checks them; the driver's fault inside the run
                argv = build_parser().parse_args(["train", *run.train_args(20, 1024)])
                config, problems = train_cmd.build_config(argv)
                assert problems + config.problems(run.ranks, True) == [], run
                assert run.external is None or 3 <= run.external.step <= 10, run
                continue
            kills = [parse_kill(text) for text in run.kills]
            config = FaultConfig(kills=kills, kill_random=0.1 if run.kill_seed is not None else 0.0,
                                 kill_seed=run.kill_seed, checkpoint_dir="d" if run.checkpoint else None,
                                 checkpoint_every=5 if run.checkpoint else 0)
            assert not config.problems(20, run.ranks, True, run.topology == "ps"), run
            first_recovery = [k for k in kills if k.phase == "recovery" and run.topology == "ps"]
            assert all(k.step == 1 for k in first_recovery), run  # PS: the first recovery, whatever its step
            assert 4 <= run.ranks <= 6 and all(4 <= k.step <= 15 for k in kills if k not in first_recovery), run
            lost = run.expected_lost() or set()
            servers_lost = {i for i in lost if i < run.servers}
            assert run.checkpoint == (len(servers_lost) >= 2), run  # two copies of a shard lost: checkpoints
            workers_left = run.ranks - run.servers - (len(lost) - len(servers_lost))
            promoted = run.topology == "ps" and len(servers_lost) == run.servers
            assert run.ranks - len(lost) >= 2 and workers_left - promoted >= (1 if run.topology == "ps" else 0)


def test_two_runs_one_ps_one_ring_pass_every_check_end_to_end(tmp_path):
    out, folder = tmp_path / "soak.json", tmp_path / "runs"
    done = hpcreduce_cli("bench", "soak", "--runs", "2", "--seed", "1", "--steps", str(STEPS), "--batch", "512",
                         "--out", str(folder), "--json", str(out), timeout=300)
    assert done.returncode == 0, done
    result = json.loads(out.read_text())
    assert [r["run"]["topology"] for r in result["runs"]] == ["ps", "ring"]
    assert result["passed"] == 2 and not result["failed"], result["failed"]
    for run in result["runs"]:
        kill_log = (folder / f"run-{run['run']['index']:04d}.kills").read_text().splitlines()
        assert len(kill_log) >= 1 and len(run["recoveries_s"]) >= 1
        assert all(0 < seconds < 60 for seconds in run["recoveries_s"])
        assert run["loss"] is not None and run["quiet_loss"] is not None
    assert result["slowest_recovery_s"] == max(s for run in result["runs"] for s in run["recoveries_s"])
    assert "soak: 2 runs (seed 1), 2 passed, 0 failed" in done.output
    assert done.output.count(": ok") == 2, done.output


def test_the_checker_fails_a_run_that_breaks_each_promise(tmp_path):
    """A real ASP run with --ft and no kill, checked as if it were soak runs that promised otherwise."""
    args = Namespace(steps=STEPS, batch=512, hostfile=None, timeout=180, tolerance=soak.DEFAULT_TOLERANCE)
    runner = soak.Soak(tmp_path, args)
    claimed = SoakRun(0, "ps", "asp", 4, 2, "worker", kills=("3@6",))
    returncode, data, left, _ = runner.execute(runner.train_args(replace(claimed, kills=()), quiet=False), {})
    assert returncode == 0 and data is not None and not left, (returncode, left)
    loss = data["final"]["loss"]

    def problems(run=claimed, data=data, kill_times=(), quiet_loss=loss, returncode=0):
        return soak.check(run, STEPS, returncode, data, list(kill_times), quiet_loss, args.tolerance, args.timeout)

    assert problems(replace(claimed, kills=())) == [], "the run as it was passes"
    assert problems(returncode=None) == ["did not end by itself within 180 s (a hang; killed)"]
    assert problems(returncode=137) == ["exit status 137"]
    assert problems() == ["ranks lost [], the victims were [3]"]  # its kill never happened
    random_run = replace(claimed, victims="random", kills=(), kill_seed=5)
    assert problems(random_run) == ["no rank was lost: the random kill never happened"]
    assert problems(random_run, kill_times=[1.0]) == [
        "no rank was lost: the random kill never happened",
        "1 kill(s) in the kill log, 0 rank(s) lost in the recovery events"]
    quiet = replace(claimed, victims="random", kill_seed=5)
    band = problems(quiet, quiet_loss=loss / (1 + 2 * args.tolerance))
    assert any("off the quiet run's" in p and f"tolerance {args.tolerance:.2%}" in p for p in band), band
    exact = problems(replace(quiet, consistency="bsp"), quiet_loss=loss * (1 + 1e-3))
    assert any("tolerance 0.01%" in p for p in exact), exact
    pushes = data["ps"]["pushes"]
    pushes["applied_per_worker"][0] += 1
    assert any(p.startswith("worker slot 0: servers applied") for p in problems(quiet)), "a push applied twice"
    pushes["applied_per_worker"][0] -= 1
    data["steps"] = data["steps"][:-1]
    assert any("not 1..12 once each" in p for p in problems(quiet))


def test_a_stopped_rank_ends_with_the_deadline_s_clear_error_and_nothing_left(tmp_path):
    args = Namespace(steps=STEPS, batch=512, hostfile=None, timeout=120, tolerance=soak.DEFAULT_TOLERANCE)
    run = SoakRun(0, "ring", "bsp", 4, 0, "stop", external=External("stop", 2, 3),
                  extra=("--deadline", str(STOP_DEADLINE // 2)))  # the soak's 15 s, halved: the suite's time
    outcome = soak.Soak(tmp_path, args).soak(run)
    assert outcome.passed, outcome  # the deadline ended it (or it recovered): never a hang, nothing left running
    if outcome.error:
        assert "DeadlineExceededError" in outcome.error and "a peer is hung" in outcome.error, outcome
    assert "SIGSTOP rank 2 after step 3" in (tmp_path / "run-0000.kills").read_text()
    assert not soak.processes_naming(str(tmp_path / "run-0000.json"))


def test_a_lost_daemon_ends_clearly_or_recovers_and_the_soak_says_which(tmp_path):
    from multinode import nodes
    nodes(tmp_path, [2, 2])  # skips, saying why, without root and unshare
    args = Namespace(steps=STEPS, batch=512, hostfile=None, timeout=120, tolerance=soak.DEFAULT_TOLERANCE)
    run = SoakRun(0, "ring", "bsp", 4, 0, "daemon", external=External("daemon", 2, 3))
    outcome = soak.Soak(tmp_path, args).soak(run)
    assert "SIGKILL node2's prted after step 3" in (tmp_path / "run-0000.kills").read_text()
    # Open MPI's mpirun exits 0 after losing a daemon; the launcher makes that a clear non-zero end
    assert outcome.passed and outcome.error and "lost the daemon of node(s) node2" in outcome.error, outcome
    assert ": ok, a clear error: hpcreduce: the job did not finish" in soak.render_outcome(outcome, 1)


def test_a_clear_error_is_hpcreduce_s_own_line_without_a_traceback():
    assert soak.clear_error("x\nhpcreduce train: error on rank 0 of 4: boom\n") == \
        "hpcreduce train: error on rank 0 of 4: boom"
    assert soak.clear_error("hpcreduce: DeadlineExceededError: rank 0 of 5 waited\n").startswith("hpcreduce: Deadline")
    assert soak.clear_error("Traceback (most recent call last):\nhpcreduce train: error: boom\n") is None
    assert soak.clear_error("MPI_ERR_OTHER\nhpcreduce: OMPI_MCA_osc=^ucx mpirun -n 4\n") is None
    growth = "hpcreduce: rank 3: a rank died during the growth at step 4 (spawning 1 rank(s)) (...)"
    assert soak.clear_error(f"x\n{growth}\n") == growth
    assert soak.clear_error("hpcreduce: the job did not finish: mpirun lost the daemon of node(s) node2 and exited 0\n")


def test_bad_soak_flags_are_refused_by_name_and_node_loss_without_nodes_is_skipped_saying_why(tmp_path):
    done = hpcreduce_cli("bench", "soak", "--runs", "0", "-n", "3", "--steps", "5", "--tolerance", "-1",
                         "--restarts", "1", "--out", str(tmp_path), timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.output, done
    for message in ("--runs must be at least 1, got 0", "--steps must be at least 12, got 5",
                    "--tolerance must be at least 0, got -1", "-n (the most ranks a run gets) must be at least 4",
                    "--restarts does not apply"):
        assert done.output.count(message) == 1, (message, done.output)
    out = tmp_path / "recovery.json"
    done = hpcreduce_cli("bench", "recovery", "--cases", "node-loss-ring,node-loss-ps", "--counts", "4",
                         "--json", str(out), timeout=60)
    assert done.returncode == 0, done
    skipped = json.loads(out.read_text())["skipped"]
    assert sorted(skipped) == ["node-loss-ps", "node-loss-ring"] and not json.loads(out.read_text())["rows"]
    assert "--hostfile with 2 nodes or more" in skipped["node-loss-ring"]
    assert "--hostfile with 3 nodes or more" in skipped["node-loss-ps"]
