"""Ring-mode fault tolerance with real SIGKILLs under mpirun --with-ft ulfm, growth by spawn,
the deadline on a hung peer, and the checkpoint-and-relaunch fallback without ULFM.

Every run trains the same steps as the reference run without failures: the global batch
of a step does not depend on the number of ranks, so the survivors' result differs from
the reference only by floating-point summation order (checked to 1e-5 relative).
"""
import json
import subprocess
import time

import pytest

from mpi_run import hpcreduce_cli

TRAIN = ("train", "--steps", "30", "--batch", "1024", "--seed", "3")
TIMEOUT = 120


def train(tmp_path, name, *args, ranks=4, ft=True, env=None):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, "-n", str(ranks), *(["--ft"] if ft else []), *args,
                           "--json", str(out), timeout=TIMEOUT, env=env)
    return result, (json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result, data = train(tmp_path_factory.mktemp("reference"), "reference", ft=False)
    assert result.returncode == 0, result
    return data["final"]


def assert_same_training(data, reference):
    assert data["final"]["checksum"] == pytest.approx(reference["checksum"], rel=1e-5)
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=1e-5)


def failures(data):
    return [e for e in data["recovery"] if e["kind"] == "failure"]


@pytest.mark.parametrize("kills, lost, ranks_left", [
    (["2@10"], [[2]], 3),                               # a worker
    (["0@12"], [[0]], 3),                               # rank 0, which reports
    (["1@8", "3@20"], [[1], [3]], 2),                   # two ranks, one after the other
    (["2@15", "1@15:recovery"], [[1, 2]], 2),           # a rank dies during the recovery
])
def test_killed_ranks_are_survived_and_the_run_ends_by_itself(tmp_path, reference, kills, lost, ranks_left):
    args = [arg for kill in kills for arg in ("--kill", kill)]
    result, data = train(tmp_path, "killed", *args)
    assert result.returncode == 0, result
    assert [sorted(e["lost"]) for e in failures(data)] == lost, data["recovery"]
    assert data["ranks"] == ranks_left
    assert all(e["to_next_step_s"] is not None and e["shrink_s"] < 5 for e in failures(data))
    assert len(data["steps"]) == 30 and data["steps"][-1]["step"] == 30  # no step lost or done twice
    assert_same_training(data, reference)
    assert "recovery: failure at step" in result.output


@pytest.mark.parametrize("grow, ranks_after", [(["1@10"], 3), (["2@10"], 4), (["1@5", "1@20"], 4)])
def test_growth_spawns_ranks_that_get_the_state_and_a_share(tmp_path, reference, grow, ranks_after):
    args = [arg for g in grow for arg in ("--grow", g)]
    result, data = train(tmp_path, "grown", *args, ranks=2)
    assert result.returncode == 0, result
    growth = [e for e in data["recovery"] if e["kind"] == "growth"]
    assert len(growth) == len(grow) and data["ranks"] == ranks_after
    assert sorted(i for e in growth for i in e["joined"]) == list(range(2, ranks_after))
    assert len(data["traffic"]["bytes_sent"]) == ranks_after
    assert all(sum(per_step) > 0 for per_step in data["traffic"]["bytes_sent"])  # newcomers reduce too
    assert_same_training(data, reference)


def test_replace_keeps_the_size_and_discovery_grows_the_job(tmp_path, reference):
    result, data = train(tmp_path, "replaced", "--kill", "1@8", "--replace")
    assert result.returncode == 0, result
    assert [e["kind"] for e in data["recovery"]] == ["failure", "replacement"]
    assert data["ranks"] == 4
    assert_same_training(data, reference)
    target = tmp_path / "target"
    target.write_text("3\n")
    result, data = train(tmp_path, "discovered", "--discover", str(target), ranks=2)
    assert result.returncode == 0, result
    assert data["ranks"] == 3 and data["recovery"][0]["kind"] == "growth"


@pytest.mark.parametrize("seed", [11, pytest.param(12, marks=pytest.mark.extended), pytest.param(13, marks=pytest.mark.extended)])
def test_random_kills_never_hang(tmp_path, reference, seed):
    log = tmp_path / "kills.log"
    result, data = train(tmp_path, "random", "--kill-random", "0.08", "--kill-seed", str(seed), ranks=5,
                         env={"HPCREDUCE_KILL_LOG": str(log)})
    assert result.returncode == 0, result
    assert failures(data) and log.read_text().strip(), "a random kill really happened"
    assert data["ranks"] == 5 - sum(len(e["lost"]) for e in failures(data))
    assert_same_training(data, reference)


def test_random_kills_during_native_allreduces_never_hang(tmp_path):
    # The MLP's gradients are small, so they go through MPI_Allreduce rather than the ring:
    # a rank that sees the failure must revoke, or peers could wait in the collective forever.
    result, data = train(tmp_path, "native", "--model", "mlp", "--kill-random", "0.1", "--kill-seed", "2",
                         ranks=5)
    assert result.returncode == 0, result
    assert len(failures(data)) >= 1 and data["ranks"] == 5 - sum(len(e["lost"]) for e in failures(data))


def test_a_hung_peer_ends_the_job_with_a_clear_error(tmp_path):
    result, _ = train(tmp_path, "hung", "--kill", "1@5:hang", "--deadline", "3", ranks=3)
    assert result.returncode != 0
    assert "DeadlineExceededError" in result.output and "a peer is hung" in result.output
    time.sleep(1)  # the launcher's kills of the aborted job's ranks land
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, timeout=30).stdout.split()
    assert not left, f"processes of the aborted job outlived it: {left}"


def test_without_ulfm_a_kill_is_recovered_by_relaunch_from_the_checkpoint(tmp_path, reference):
    folder = tmp_path / "ckpt"
    result, data = train(tmp_path, "relaunched", "--checkpoint-dir", str(folder), "--checkpoint-every", "10",
                         "--kill", "2@25", "--restarts", "1", ft=False)
    assert result.returncode == 0, result
    assert "restart 1 of 1" in result.output and "resumed from the checkpoint of step 20" in result.output
    assert data["final"]["checksum"] == reference["checksum"]  # same ranks, same order: bit for bit


def test_a_kill_during_the_checkpoint_write_leaves_the_previous_one(tmp_path, reference):
    folder = tmp_path / "ckpt"
    result, _ = train(tmp_path, "first", "--checkpoint-dir", str(folder), "--checkpoint-every", "10",
                      "--kill", "0@20:checkpoint", ft=False)
    assert result.returncode != 0
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["ckpt-000000010.npz"]
    # The relaunch may have fewer ranks: checkpoints hold whole arrays.
    result, data = train(tmp_path, "resumed", "--checkpoint-dir", str(folder), "--checkpoint-every", "10",
                         ranks=3, ft=False)
    assert result.returncode == 0, result
    assert "resumed from the checkpoint of step 10 (written by 4 ranks, now 3)" in result.output
    assert_same_training(data, reference)


def test_fault_injection_without_ulfm_is_refused_on_every_rank(tmp_path):
    result, _ = train(tmp_path, "refused", "--kill", "1@5", ft=False, ranks=2)
    assert result.returncode == 2
    assert "--kill needs in-job fault tolerance: launch with --ft" in result.output
