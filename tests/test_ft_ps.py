"""Parameter-server fault tolerance with real SIGKILLs under mpirun --with-ft ulfm.

The reference is the same BSP run without failures (3 workers; the number of servers does not
change the arithmetic, which is elementwise). Tolerances:
- BSP, servers lost: bit for bit (the replica got every push in the same order, and the
  interrupted step is computed again with the same split);
- BSP, workers lost or joined: 1e-5 relative, summation order only. BSP restarts at the first
  step no shard has applied (a step some shard applied had every worker's push everywhere and
  is completed everywhere), so a dead worker's partial push is never applied on some shards
  only: the survivors recompute the same global batches over the new split;
- ASP: pushes apply in arrival order, so runs differ even without failures: the final loss
  must be within 10% of the BSP reference (it falls from 0.69 to 0.46 over the run).
Exactly once: for every worker alive at the end (and a worker promoted to server), the pushes
the servers applied (``applied_per_worker``, per piece) equal the pieces it had acknowledged
(``made_per_worker``), once lost updates are taken off; duplicates are counted apart.
"""
import json
import math
import subprocess
import time

import pytest

from mpi_run import hpcreduce_cli, mpirun

TRAIN = ("train", "--mode", "ps", "--steps", "30", "--batch", "1024", "--seed", "3")
TIMEOUT = 120


def train(tmp_path, name, *args, ranks, servers, ft=True, env=None):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, "-n", str(ranks), "--servers", str(servers), *(["--ft"] if ft else []),
                           *args, "--json", str(out), timeout=TIMEOUT, env=env)
    return result, (json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result, data = train(tmp_path_factory.mktemp("reference"), "reference", ranks=4, servers=1, ft=False)
    assert result.returncode == 0, result
    return data["final"]


def assert_trained_like(data, reference, consistency):
    if consistency == "asp":
        assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=0.1)
    else:
        assert data["final"]["checksum"] == pytest.approx(reference["checksum"], rel=1e-5)
        assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=1e-5)


def assert_exactly_once(data):
    pushes = data["ps"]["pushes"]
    live = [slot for slot, made in enumerate(pushes["made_per_worker"]) if made >= 0]
    assert set(data["ps"]["worker_slots"]) <= set(live)
    for slot in live:
        assert pushes["applied_per_worker"][slot] == pushes["made_per_worker"][slot], pushes
        assert pushes["made_per_worker"][slot] > 0


def failures(data):
    return [e for e in data["recovery"] if e["kind"] == "failure"]


def kills(*texts):
    return [arg for text in texts for arg in ("--kill", text)]


@pytest.mark.parametrize("consistency, servers, ranks, killed, lost_servers, lost_workers", [
    ("bsp", 2, 5, ["4@10"], [[]], [[4]]),                        # a worker
    pytest.param("bsp", 2, 5, ["1@10"], [[1]], [[]], marks=pytest.mark.extended),  # a server, K=2
    ("asp", 2, 5, ["0@12"], [[0]], [[]]),                        # rank 0 itself, which reports
    ("bsp", 3, 6, ["2@10"], [[2]], [[]]),                        # a server, K=3
    pytest.param("asp", 3, 6, ["1@10"], [[1]], [[]], marks=pytest.mark.extended),
    ("bsp", 3, 6, ["1@8", "4@20"], [[1], []], [[], [4]]),       # two ranks, one after the other
    ("bsp", 2, 5, ["4@10", "1@10:recovery"], [[1]], [[4]]),     # a server dies during the recovery
])
def test_killed_ranks_are_survived_and_the_run_ends_by_itself(tmp_path, reference, consistency, servers, ranks,
                                                             killed, lost_servers, lost_workers):
    log = tmp_path / "kills.log"
    metrics = tmp_path / "metrics.jsonl"
    result, data = train(tmp_path, "killed", "--consistency", consistency, *kills(*killed), "--metrics", str(metrics),
                         ranks=ranks, servers=servers, env={"HPCREDUCE_KILL_LOG": str(log)})
    assert result.returncode == 0, result
    events = failures(data)
    assert [sorted(e["lost_servers"]) for e in events] == lost_servers, data["recovery"]
    assert [sorted(e["lost_workers"]) for e in events] == lost_workers, data["recovery"]
    assert data["ranks"] == ranks - len(killed)
    killed_at = sorted(float(line.split()[0]) for line in log.read_text().splitlines())
    for event, kill_time in zip(events, killed_at):
        assert kill_time <= event["detected_at"] < event["next_step_at"], (event, kill_time)
        assert event["shrink_s"] < 5 and event["to_next_step_s"] is not None
        if event["lost_servers"]:
            assert event["shards_adopted"] == event["lost_servers"] and not event["shards_restored"]
    if "recovery" in killed[-1]:
        assert events[0]["rounds"] >= 2
    # every row is the step's global batch: a lost worker's share of the steps before its loss stays
    assert [row["examples"] for row in data["steps"]] == [1024] * 30, data["steps"]
    live = [json.loads(line) for line in metrics.read_text().splitlines()]  # a server's, live
    if not any(lost_servers):  # the writing server lost: lines of the steps around the loss may be missing
        assert [(row["step"], row["examples"]) for row in live] == [(step, 1024) for step in range(1, 31)], live
    assert_exactly_once(data)
    if consistency == "bsp" and not any(lost_workers):
        assert data["final"]["checksum"] == reference["checksum"], "servers lost: bit for bit"
    assert_trained_like(data, reference, consistency)
    assert "recovery: failure at step" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("consistency", ["bsp", "asp"])
def test_a_lone_server_is_replaced_by_a_worker_from_the_checkpoint_and_lost_updates_are_counted(
        tmp_path, reference, consistency):
    result, data = train(tmp_path, "k1", "--consistency", consistency, "--checkpoint-dir", str(tmp_path / "ckpt"),
                         "--checkpoint-every", "5", *kills("0@14"), ranks=4, servers=1)
    assert result.returncode == 0, result
    (event,) = failures(data)
    assert event["lost_servers"] == [0] and event["promoted"] == 1 and event["shards_restored"] == [0]
    assert event["checkpoint_step"] == 10 and event["updates_lost"] > 0
    lost = [n for n in data["ps"]["pushes"]["updates_lost_per_worker"] if n >= 0]
    assert sum(lost) == event["updates_lost"]
    assert data["ranks"] == 3 and data["ps"]["server_ranks"] == [0] and data["workers"] == 2
    assert_exactly_once(data)
    assert_trained_like(data, reference, consistency)
    assert "acknowledged updates lost" in result.output


def test_a_lone_server_without_a_checkpoint_is_refused_unless_accepted_then_its_loss_fails_clearly(tmp_path):
    refused, _ = train(tmp_path, "refused", ranks=3, servers=1)
    assert refused.returncode == 2 and "its death would end the job" in refused.output, refused
    result, _ = train(tmp_path, "no-checkpoint", *kills("0@5"), "--accept-server-loss", ranks=3, servers=1)
    assert result.returncode == 1, result
    assert "parameter-server recovery failed" in result.output and "no complete checkpoint" in result.output
    assert result.output.count("died together with their replica") == 2, "every rank reports it"


def test_growth_adds_a_worker_that_pulls_the_weights_and_takes_a_share(tmp_path, reference):
    result, data = train(tmp_path, "grown", "--grow", "1@10", ranks=4, servers=2)
    assert result.returncode == 0, result
    (growth,) = [e for e in data["recovery"] if e["kind"] == "growth"]
    assert growth["joined"] == [4] and data["ranks"] == 5 and data["workers"] == 3
    assert data["ps"]["pushes"]["made_per_worker"][2] > 0, "the newcomer pushed"
    assert_exactly_once(data)
    assert_trained_like(data, reference, "bsp")


@pytest.mark.parametrize("consistency, fetch_every", [("bsp", 1), ("ssp", 1), pytest.param("asp", 1, marks=pytest.mark.extended), ("asp", 4)])
def test_a_newcomer_pulls_the_weights_before_its_first_step_under_every_consistency_and_fetch(
        tmp_path, reference, consistency, fetch_every):
    """Growth at step 7, off the --fetch-every 4 schedule: the newcomer must still read every dense
    table first (a worker's tables are NaN until pulled: its push would be refused). --fetch-every
    only applies to asp. Loss: BSP as the run without growth up to summation order; SSP and ASP
    within 10% (it falls from 0.69 to 0.46 over the run)."""
    result, data = train(tmp_path, "grown", "--consistency", consistency, "--fetch-every", str(fetch_every),
                         "--grow", "1@7", "--accept-server-loss", ranks=4, servers=1)
    assert result.returncode == 0, result
    assert "NaN" not in result.output and "refused" not in result.output, result
    (growth,) = [e for e in data["recovery"] if e["kind"] == "growth"]
    assert growth["joined"] == [4] and data["ranks"] == 5 and data["workers"] == 4
    assert data["ps"]["pushes"]["made_per_worker"][3] > 0, "the newcomer trained and pushed"
    assert_exactly_once(data)
    assert math.isfinite(data["final"]["loss"])
    rel = 1e-5 if consistency == "bsp" else 0.1
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=rel)


@pytest.mark.parametrize("seed, consistency", [(11, "bsp"), (12, "asp"), pytest.param(13, "bsp", marks=pytest.mark.extended)])
def test_random_kills_never_hang(tmp_path, reference, seed, consistency):
    result, data = train(tmp_path, "random", "--consistency", consistency, "--kill-random", "0.08",
                         "--kill-seed", str(seed), ranks=5, servers=2,
                         env={"HPCREDUCE_KILL_LOG": str(tmp_path / "k")})
    assert result.returncode == 0, result
    assert failures(data) and (tmp_path / "k").read_text().strip(), "a random kill really happened"
    assert data["ranks"] == 5 - sum(len(e["lost"]) for e in failures(data))
    assert_exactly_once(data)
    assert_trained_like(data, reference, consistency)


def test_dense_tables_cut_across_servers_survive_a_server_loss_bit_for_bit():
    result = mpirun(6, "ft_ps_dense.py", ft=True, timeout=TIMEOUT)
    assert result.returncode == 0, result
    assert "ft ps dense: bsp checksum equal after a server loss, asp exactly once" in result.output, result


def test_without_ft_a_hung_worker_ends_the_job_by_the_deadline(tmp_path):
    log = tmp_path / "kills.log"
    started = time.monotonic()
    result, _ = train(tmp_path, "hung", "--kill", "2@5:hang", "--deadline", "3", ranks=3, servers=1, ft=False,
                      env={"HPCREDUCE_KILL_LOG": str(log)})
    assert time.monotonic() - started < TIMEOUT / 2, "ended by its deadline, well before the test timeout"
    assert result.returncode != 0 and "hang at step 5" in log.read_text()
    assert "DeadlineExceededError" in result.output and "a peer is hung" in result.output, result
    time.sleep(1)  # the launcher's kills of the aborted job's ranks land
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, timeout=60).stdout.split()
    assert not left, f"processes of the aborted job outlived it: {left}"


def test_fault_flags_without_ulfm_are_refused_in_ps_mode(tmp_path):
    result, _ = train(tmp_path, "refused", "--kill", "2@5", ranks=3, servers=1, ft=False)  # no --checkpoint-dir
    assert result.returncode != 0 and "need in-job fault tolerance" in result.output, result
