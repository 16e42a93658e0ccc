"""Parameter-server runs without ULFM: shard checkpoints, real SIGKILLs, relaunch and resume.

Every killed run resumes from the latest complete checkpoint (step 10: checkpoints every 5
steps, kills at steps 12 to 15) and must end where the reference run without a kill ends:
- BSP: the same global batches (by global step, for any worker count), so the final
  parameters equal the reference up to summation order (1e-5 relative), whatever K and the
  worker count of the launch that wrote the checkpoint;
- SSP (staleness 1): pushes apply in arrival order, so runs differ even without kills: the
  final loss must be within 10% of the BSP reference (0.49 after the 20 steps).
  A worker killed at step 14 read at clock 12, so both servers had seen every clock reach 11
  and written checkpoint 10 before acknowledging its last push.
Exactly once, for the resumed part: the pieces the servers applied per worker slot equal the
pieces each worker had acknowledged.
"""
import json
import os
import re
import shutil

import pytest

from mpi_run import hpcreduce_cli

TRAIN = ("train", "--mode", "ps", "--batch", "1024", "--seed", "3", "--steps", "20", "--quiet")
TIMEOUT = 180


def train(tmp_path, name, *args, ranks, servers, env=None):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, "-n", str(ranks), "--servers", str(servers), *args, "--json", str(out),
                           timeout=TIMEOUT, env=env)
    return result, (json.loads(out.read_text()) if out.exists() else None)


def checkpointed(folder, *args):
    return ("--checkpoint-dir", str(folder), "--checkpoint-every", "5", *args)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result, data = train(tmp_path_factory.mktemp("reference"), "reference", ranks=4, servers=1)
    assert result.returncode == 0, result
    return data["final"]


def assert_resumed(data, ranks_before, ranks_after):
    event, = data["recovery"]
    assert event["kind"] == "resume" and event["checkpoint_step"] == 10 and event["step"] == 11, event
    assert (event["ranks_before"], event["ranks_after"]) == (ranks_before, ranks_after), event
    assert event["next_step_at"] > event["detected_at"] and event["restore_s"] >= 0, event
    assert [row["step"] for row in data["steps"]] == list(range(11, 21))  # the resumed steps, each once
    per_step = data["traffic"]["bytes_sent"] + data["ps"]["load"]["requests_per_step"]
    assert {len(cells) for cells in per_step} == {10}, per_step
    pushes = data["ps"]["pushes"]
    assert pushes["applied_per_worker"] == pushes["made_per_worker"], pushes
    assert all(made > 0 for made in pushes["made_per_worker"]), pushes
    return event


def assert_same_training(data, reference):
    assert data["final"]["checksum"] == pytest.approx(reference["checksum"], rel=1e-5)
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=1e-5)


def test_a_killed_worker_is_relaunched_and_the_run_resumes_the_same_bsp_training(tmp_path, reference):
    log = tmp_path / "kills.log"
    result, data = train(tmp_path, "killed", *checkpointed(tmp_path / "ckpt", "--kill", "3@12", "--restarts", "1"),
                         ranks=4, servers=2, env={"HPCREDUCE_KILL_LOG": str(log)})
    assert result.returncode == 0, result
    assert "restart 1 of 1" in result.output and "resumed from the checkpoint of step 10" in result.output, result
    event = assert_resumed(data, 4, 4)
    assert event["restart_step"] == 11 and event["shards_restored"] == [0, 1]
    # the victim's own pushes of step 11 were acknowledged before it died; the checkpoint lacks them
    assert event["updates_lost"] >= 3, event
    killed_at = float(log.read_text().split()[0])
    assert event["next_step_at"] > killed_at, (event, killed_at)  # the restart time bench recovery reports
    assert_same_training(data, reference)


def test_a_server_killed_while_checkpointing_is_resumed_by_other_servers_and_workers(tmp_path, reference):
    folder = tmp_path / "ckpt"
    result, _ = train(tmp_path, "first", *checkpointed(folder, "--kill", "1@15:checkpoint"), ranks=5, servers=3)
    assert result.returncode != 0, result
    assert [p.name for p in (folder / "ps-shard-1").iterdir() if p.name.startswith(".ckpt-000000015")], \
        "the victim's torn write is a temporary"
    # whether the other servers finished writing 15 before mpirun ended them is a race: make one have
    incomplete = folder / "ps-shard-2" / "ckpt-000000015.npz"
    if not incomplete.exists():
        shutil.copy(folder / "ps-shard-2" / "ckpt-000000010.npz", incomplete)

    result, data = train(tmp_path, "resumed", *checkpointed(folder), ranks=3, servers=2)
    assert result.returncode == 0, result
    assert "written by 3 server(s) and 2 worker(s), now 2 and 1" in result.output, result
    event = assert_resumed(data, 5, 3)
    # each worker's pushes of steps 11-14 at least were acknowledged by each of the 3 shards
    assert event["updates_lost"] >= 4 * 2 * 3, event
    assert_same_training(data, reference)
    left = {p.relative_to(folder).as_posix() for p in folder.rglob("*.npz*")}
    assert not any(os.path.basename(name).startswith(".") for name in left), left  # the temporary is gone
    assert not incomplete.exists(), left  # checkpoint 15 was incomplete: removed before resuming


def test_ssp_resumes_exactly_once_and_a_foreign_folder_is_refused_on_every_rank(tmp_path, reference):
    folder = tmp_path / "ckpt"
    result, data = train(tmp_path, "ssp", *checkpointed(folder, "--kill", "3@14", "--restarts", "1"),
                         "--consistency", "ssp", "--staleness", "1", ranks=4, servers=2)
    assert result.returncode == 0, result
    event = assert_resumed(data, 4, 4)
    assert event["updates_lost"] >= 3 and event["restart_step"] is None, event
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=0.1)

    result, _ = train(tmp_path, "foreign", *checkpointed(folder), "--seed", "4", ranks=3, servers=1)
    errors = dict(re.findall(r"error on rank (\d+) of \d+: (.*)", result.output))
    assert result.returncode == 1 and sorted(errors) == ["0", "1", "2"], result
    assert all(re.search("its checkpoint of step [0-9]+ was written by a run with seed 3, this run has seed 4",
                         line) for line in errors.values()), result


def test_asp_pushes_past_the_checkpoint_are_never_applied_twice(tmp_path, reference):
    """Worker 3 computes 4x as long, so worker 2 has pushed steps past 10 when checkpoint 10 is
    written (at the slowest clock): after the relaunch its shards answer those again DUPLICATE."""
    result, data = train(tmp_path, "asp", *checkpointed(tmp_path / "ckpt", "--kill", "3@14", "--restarts", "1"),
                         "--consistency", "asp", "--slow", "3:4", ranks=4, servers=2)
    assert result.returncode == 0, result
    pushes = data["ps"]["pushes"]
    assert pushes["applied_per_worker"] == pushes["made_per_worker"], pushes
    assert pushes["duplicates_per_worker"][0] > 0, pushes  # the fast worker's steps the checkpoint holds
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=0.1)


def test_without_ulfm_kills_need_a_checkpoint_folder_and_growth_is_refused_once(tmp_path):
    result = hpcreduce_cli(*TRAIN, "-n", "3", "--kill", "2@5", timeout=60, cwd=str(tmp_path))
    assert result.returncode == 2 and result.output.count("hpcreduce train:") == 1, result
    assert "--kill and --kill-random need in-job fault tolerance (--ft, ULFM) or --checkpoint-dir" in result.output
    result = hpcreduce_cli(*TRAIN, "-n", "3", "--grow", "1@5", "--checkpoint-dir", "c", timeout=60, cwd=str(tmp_path))
    assert result.returncode == 2 and result.output.count("hpcreduce train:") == 1, result
    assert "--grow needs in-job fault tolerance: launch with ULFM (--ft)" in result.output, result
