"""``--mode hybrid``: sparse tables on the servers, dense parameters allreduced among the workers.

Real ``hpcreduce train`` jobs under mpirun (logreg: a sparse hashed table on the servers and a
dense bias on the workers). BSP hybrid computes what BSP ps does (the servers apply the summed
pushes; the workers the same mean gradient): the checksum is compared to ps mode's at 1e-9.
Every run checks that each live worker's dense replica is bitwise the same (``ps.hybrid``: one
checksum per worker) and that every step's dense update is in on every worker.
"""
import json
import sys

import numpy as np
import pytest

from hpcreduce.runtime.launch import build_mpirun
from hpcreduce.train.ps.dense_checkpoints import saved as dense_saved
from hpcreduce.train.results import checksum
from mpi_run import MPI_SCRIPTS, hpcreduce_cli, mpirun, run_job

TRAIN = ("train", "--steps", "30", "--batch", "1024", "--seed", "3", "--progress", "none")
TIMEOUT = 150


def train(tmp_path, name, mode, *args, ranks=4, servers=2, ft=False, env=None):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, "--mode", mode, "-n", str(ranks), "--servers", str(servers),
                           *(["--ft"] if ft else []), *args, "--json", str(out), timeout=TIMEOUT, env=env)
    return result, (json.loads(out.read_text()) if out.exists() else None)


def assert_replicas_in_step(data, workers):
    hybrid = data["ps"]["hybrid"]
    assert len(hybrid["dense_checksums"]) == workers
    assert hybrid["dense_identical"] and len(set(hybrid["dense_checksums"])) == 1, hybrid
    assert hybrid["dense_steps_applied"] == [30] * workers, hybrid


@pytest.fixture(scope="module")
def ps_bsp(tmp_path_factory):
    result, data = train(tmp_path_factory.mktemp("ps"), "ps", "ps")
    assert result.returncode == 0, result
    return data


def test_bsp_hybrid_trains_what_ps_trains_with_the_dense_parameters_off_the_servers(tmp_path, ps_bsp):
    result, data = train(tmp_path, "hybrid", "hybrid")
    assert result.returncode == 0, result
    assert data["mode"] == "hybrid"
    assert_replicas_in_step(data, workers=2)
    assert data["final"]["checksum"] == pytest.approx(ps_bsp["final"]["checksum"], rel=1e-9)
    assert data["final"]["accuracy"] == pytest.approx(ps_bsp["final"]["accuracy"], abs=1e-3)
    assert "bias" in ps_bsp["ps"]["pieces"] and data["ps"]["pieces"] == {}  # no dense piece on a server


def test_ssp_hybrid_learns_as_well_as_ps(tmp_path):
    accuracy = {}
    for mode in ("ps", "hybrid"):
        result, data = train(tmp_path, mode, mode, "--consistency", "ssp", "--staleness", "2", ranks=5)
        assert result.returncode == 0, result
        accuracy[mode] = data["final"]["accuracy"]
    assert_replicas_in_step(data, workers=3)
    assert accuracy["hybrid"] == pytest.approx(accuracy["ps"], abs=0.01)
    assert accuracy["hybrid"] > 0.75  # logreg reaches ~0.78 in 30 steps; the start is ~0.5


@pytest.mark.parametrize("args, message", [
    (("--model", "mlp"), "--model mlp has no sparse table"),
    (("--consistency", "asp", "--fetch-every", "2"), "--fetch-every paces pulls of dense tables"),
    (("--device", "gpu"), "--device gpu is not supported by --mode hybrid"),
])
def test_what_hybrid_cannot_run_is_refused_by_name(tmp_path, args, message):
    result, data = train(tmp_path, "refused", "hybrid", *args, ranks=3, servers=1)
    assert result.returncode != 0 and data is None
    assert message in result.output, result


@pytest.mark.parametrize("consistency, killed, lost", [("ssp", "3@10", "workers lost [3]"),
                                                       ("bsp", "1@10", "servers lost [1]")])
def test_a_sigkilled_worker_or_server_is_survived(tmp_path, ps_bsp, consistency, killed, lost):
    metrics = tmp_path / "metrics.jsonl"
    result, data = train(tmp_path, "killed", "hybrid", "--consistency", consistency, "--kill", killed,
                         "--metrics", str(metrics), ranks=5, ft=True)
    assert result.returncode == 0, result
    assert lost in result.output, result
    # every record is the global batch's, the lost worker's share of the steps before its loss included;
    # under SSP the step it died in may keep only the survivors' shares (computed before the loss was
    # seen: what was trained), a timing matter
    live = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in live] == list(range(1, 31)), live
    assert [row["examples"] for row in live] == [row["examples"] for row in data["steps"]], live
    examples = [row["examples"] for row in data["steps"]]
    assert examples[:9] + examples[10:] == [1024] * 29 and 1024 * 2 // 3 <= examples[9] <= 1024, examples
    assert data["ranks"] == 4 and [event["kind"] for event in data["recovery"]] == ["failure"]
    assert data["recovery"][0]["lost"] == [int(killed.split("@")[0])]
    workers = 2 if lost.startswith("workers") else 3
    assert_replicas_in_step(data, workers)
    if consistency == "bsp":  # the interrupted step is redone over the same split: summation order only
        assert data["final"]["checksum"] == pytest.approx(ps_bsp["final"]["checksum"], rel=1e-5)
    assert data["final"]["accuracy"] == pytest.approx(ps_bsp["final"]["accuracy"], abs=0.015)


def test_newcomers_get_the_dense_parameters_and_the_model_exports_whole(tmp_path, ps_bsp):
    model_dir = tmp_path / "model"
    result, data = train(tmp_path, "grown", "hybrid", "--consistency", "ssp", "--staleness", "1", "--grow", "1@8",
                         "--kill", "3@15", "--replace", "--model-dir", str(model_dir), ft=True)
    assert result.returncode == 0, result
    assert [event["kind"] for event in data["recovery"]] == ["growth", "failure", "replacement"]
    assert data["ranks"] == 5
    assert_replicas_in_step(data, workers=3)  # a founder, the grown rank and the replacement
    assert data["final"]["accuracy"] == pytest.approx(ps_bsp["final"]["accuracy"], abs=0.015)
    exported = tmp_path / "whole.npz"
    result = hpcreduce_cli("export", str(model_dir), "--out", str(exported), timeout=60)
    assert result.returncode == 0, result
    whole = dict(np.load(exported))
    assert sorted(whole) == ["bias", "weights"]
    assert checksum(whole) == data["final"]["checksum"]


@pytest.mark.extended
def test_random_kills_with_replacements_never_take_every_replacement(tmp_path):
    """Seed 6 kills a worker at step 7 while the others wait in that step's dense reduction;
    its replacement must not draw that kill again (it did, over and over, until the timeout)."""
    log = tmp_path / "kills.log"
    result, data = train(tmp_path, "random", "hybrid", "--consistency", "asp", "--kill-random", "0.06",
                         "--kill-seed", "6", "--replace", ranks=6, ft=True, env={"HPCREDUCE_KILL_LOG": str(log)})
    assert result.returncode == 0, result
    killed = log.read_text().splitlines()
    kinds = [event["kind"] for event in data["recovery"]]
    assert len(killed) >= 1 and kinds.count("failure") == len(killed) == kinds.count("replacement"), (killed, kinds)
    assert_replicas_in_step(data, workers=4)


def test_an_unrecoverable_loss_after_a_replacement_ends_every_rank(tmp_path):
    """The last server dies after a worker was replaced: every survivor (the spawned one too)
    says why and ends, never a hang (Open MPI's MPI_Finalize waited for the gone: 4 runs in 8)."""
    result, data = train(tmp_path, "lost", "hybrid", "--replace", "--accept-server-loss", "--kill", "3@3",
                         "--kill", "0@6", "--steps", "10", servers=1, ft=True)
    assert result.returncode == 1 and data is None, result
    said = "died together with their replica"
    assert [line for line in result.output.splitlines() if said in line and "error on rank" in line], result
    assert sum(said in line for line in result.output.splitlines()) == 3, result  # ranks 1, 2 and the newcomer
    assert "Traceback" not in result.output, result


def test_an_unrecoverable_loss_through_the_api_ends_every_rank():
    """The same loss in a user's script calling ``train()`` (plain python, the error uncaught):
    every rank, the spawned one too, ends with the error (without the fix: 2 hangs in 4)."""
    plan = build_mpirun(4, [sys.executable, str(MPI_SCRIPTS / "api_unrecoverable.py")], ft=True)
    result = run_job(plan.argv, timeout=60, env=plan.env)
    assert result.returncode != 0 and "trained through" not in result.output, result
    assert result.output.count("died together with their replica") == 3, result  # ranks 1, 2 and the newcomer


def test_through_the_api_bsp_hybrid_equals_ring_and_a_failing_worker_stops_every_rank():
    result = mpirun(4, "hybrid_training.py", timeout=180)
    assert result.returncode == 0, result
    assert "hybrid training: all checks passed" in result.output, result


def test_bsp_hybrid_rolled_back_to_a_checkpoint_ends_on_the_unkilled_run_and_every_checkpoint_is_whole(tmp_path):
    """The only server SIGKILLed at step 12: the tables go back to the checkpoint of step 10, the
    workers' dense replica with them, and the run ends where the unkilled run ends (it ended 0.25
    off, exit 0). The last step's checkpoint holds the dense replica too, and a run resumed from
    it lists only the steps it trained."""
    common = ("--model", "embed", "--consistency", "bsp", "--checkpoint-every", "5", "--steps", "20")
    folder = tmp_path / "whole"
    result, whole = train(tmp_path, "whole", "hybrid", *common, "--checkpoint-dir", str(folder), servers=1, ft=True)
    assert result.returncode == 0, result
    assert dense_saved(str(folder), 20), sorted(p.name for p in folder.rglob("*"))
    result, killed = train(tmp_path, "killed", "hybrid", *common, "--checkpoint-dir", str(tmp_path / "killed"),
                           "--kill", "0@12", servers=1, ft=True)
    assert result.returncode == 0, result
    assert killed["recovery"][0]["checkpoint_step"] == 10, killed["recovery"]
    # the batch re-split over 2 workers sums in another order: 2e-8 apart (the tables alone rolled back: 2e-2)
    assert killed["final"]["checksum"] == pytest.approx(whole["final"]["checksum"], rel=1e-6)
    result, resumed = train(tmp_path, "resumed", "hybrid", *common, "--checkpoint-dir", str(folder), "--steps", "23",
                            servers=1, ft=True)
    assert result.returncode == 0 and "resumed from the checkpoint of step 20" in result.output, result
    assert [row["step"] for row in resumed["steps"]] == [21, 22, 23], resumed["steps"]
