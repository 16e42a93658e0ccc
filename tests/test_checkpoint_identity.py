"""Checkpoints and output files of real ``hpcreduce train`` runs under mpirun.

A checkpoint of another run is refused on every rank, never restored; a damaged newest
checkpoint is passed over (with a warning) for the previous one; a writer killed half way
leaves a temporary that the next run removes; a checkpoint, metrics or result file that
cannot be written ends the job on every rank with an error naming it; devices, FIFOs and
/dev/stdout are written through and symlinks followed.
"""
import json
import os
import re
import stat

import pytest
from test_ft_ps_units import shards

from mpi_run import hpcreduce_cli

from hpcreduce.train.ps import shard_checkpoints as ps_checkpoint

TIMEOUT = 120
RING = ("train", "--batch", "1024", "--quiet")


def train(*args, ranks=2, ft=False):
    return hpcreduce_cli(*RING, "-n", str(ranks), *(["--ft"] if ft else []), *args, timeout=TIMEOUT)


def errors(job):
    """Rank -> the error line it printed."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"error on rank (\d+) of \d+: (.*)", job.output)}


def assert_refused_everywhere(job, ranks, text, *, trained=False):
    """Every rank printed ``text`` in its error, and the run trained to the end or not at all."""
    assert job.returncode == 1, job
    assert set(errors(job)) == set(range(ranks)) and all(text in line for line in errors(job).values()), job
    assert "Traceback" not in job.output and ("final:" in job.output) == trained, job


def test_ring_checkpoints_are_refused_across_runs_recovered_when_torn_and_cleaned_after_a_kill(tmp_path):
    folder = tmp_path / "ckpt"
    common = ("--checkpoint-dir", str(folder), "--checkpoint-every", "5")
    killed = train("--steps", "10", *common, "--kill", "0@10:checkpoint")
    assert killed.returncode != 0, killed
    temporaries = [name for name in os.listdir(folder) if name.endswith(".partial")]
    assert len(temporaries) == 1 and temporaries[0].startswith(".ckpt-000000010.npz."), os.listdir(folder)

    other = train("--steps", "10", "--model", "mlp", *common)
    assert_refused_everywhere(other, 2, f"--checkpoint-dir {folder}: its checkpoint of step 5 was written by "
                                        "a run with model logreg, this run has model mlp")
    assert sorted(os.listdir(folder)) == ["ckpt-000000005.npz"]  # the dead writer's temporary is gone
    seeded = train("--steps", "10", "--seed", "7", *common)
    assert_refused_everywhere(seeded, 2, "with seed 0, this run has seed 7")

    (folder / "ckpt-000000008.npz").write_bytes((folder / "ckpt-000000005.npz").read_bytes()[:5000])
    resumed = train("--steps", "12", *common, "--json", str(tmp_path / "resumed.json"))
    assert resumed.returncode == 0, resumed
    assert "ckpt-000000008.npz is unreadable" in resumed.output, resumed
    assert "resumed from the checkpoint of step 5" in resumed.output, resumed
    reference = train("--steps", "12", "--json", str(tmp_path / "reference.json"))
    assert reference.returncode == 0, reference
    final = [json.loads((tmp_path / f"{name}.json").read_text())["final"] for name in ("resumed", "reference")]
    assert final[0]["checksum"] == final[1]["checksum"]  # same ranks, same order: bit for bit


def test_ps_shard_checkpoints_fall_back_past_a_damaged_file_and_refuse_another_run(tmp_path):
    states, identity = shards([0, 1])[3], {"seed": 0, "lr": 0.2}
    for step in (10, 15):
        for state in states:
            ps_checkpoint.save_shard(str(tmp_path), step, state, [0, 1], bsp=True, identity=identity)
    damaged = tmp_path / "ps-shard-1" / "ckpt-000000015.npz"
    damaged.write_bytes(damaged.read_bytes()[:-100])
    warnings = []
    assert ps_checkpoint.latest_complete(str(tmp_path), warnings.append) == 10
    assert len(warnings) == 1 and str(damaged) in warnings[0], warnings
    assert ps_checkpoint.foreign_problem(str(tmp_path), identity) is None
    problem = ps_checkpoint.foreign_problem(str(tmp_path), {**identity, "lr": 0.1})
    assert re.search("with lr 0.2, this run has lr 0.1", str(problem)), problem  # refused on every rank


def test_ps_checkpoints_of_another_seed_are_refused_not_restored(tmp_path):
    folder = str(tmp_path / "ckpt")
    ps = ("train", "-n", "3", "--ft", "--mode", "ps", "--servers", "1", "--batch", "1024", "--quiet",
          "--checkpoint-dir", folder)
    first = hpcreduce_cli(*ps, "--steps", "10", "--checkpoint-every", "5", timeout=TIMEOUT)
    assert first.returncode == 0, first
    saved = sorted(os.listdir(os.path.join(folder, "ps-shard-0")))
    second = hpcreduce_cli(*ps, "--steps", "20", "--seed", "7", "--checkpoint-every", "50", "--kill", "0@5",
                           timeout=TIMEOUT)
    assert_refused_everywhere(second, 3, "its checkpoint of step 5 was written by a run with seed 0, "
                                         "this run has seed 7")
    assert "recovery" not in second.output and sorted(os.listdir(os.path.join(folder, "ps-shard-0"))) == saved


@pytest.mark.parametrize("mode", ["ring", "ps"])
def test_a_checkpoint_that_cannot_be_written_ends_the_job_on_every_rank(tmp_path, mode):
    folder = tmp_path / "ckpt"
    blocked = folder / ("ps-shard-0" if mode == "ps" else "") / "ckpt-000000005.npz"
    blocked.mkdir(parents=True)  # a folder where the checkpoint of step 5 goes
    ranks = 3 if mode == "ps" else 2
    job = hpcreduce_cli("train", "-n", str(ranks), "--ft", "--mode", mode, "--steps", "10", "--batch", "1024",
                        "--quiet", "--checkpoint-dir", str(folder), "--checkpoint-every", "5", timeout=TIMEOUT)
    # the ring stops at once; PS servers go on without checkpoints, and the end reports it
    assert_refused_everywhere(job, ranks, f"cannot write {blocked}: Is a directory", trained=mode == "ps")
    assert [p.name for p in blocked.parent.iterdir()] == [blocked.name], list(blocked.parent.iterdir())


def test_output_files_are_written_where_they_lead_and_a_failed_one_is_an_error_everywhere(tmp_path):
    link = tmp_path / "result.json"
    link.symlink_to(tmp_path / "target.json")
    device = "/dev/null"
    if os.geteuid() == 0:  # a device of our own, to see that it stays one
        device = str(tmp_path / "null")
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    job = train("--steps", "4", "--json", str(link), "--timeline", device, "--metrics", "/dev/full")
    assert_refused_everywhere(job, 2, "cannot write /dev/full: No space left on device", trained=True)
    assert link.is_symlink() and json.loads((tmp_path / "target.json").read_text())["final"]["loss"] > 0
    assert stat.S_ISCHR(os.stat(device).st_mode)

    streamed = train("--steps", "3", "--metrics", "/dev/stdout")
    assert streamed.returncode == 0, streamed
    rows = [json.loads(line) for line in streamed.output.splitlines() if line.startswith('{"step"')]
    assert [row["step"] for row in rows] == [1, 2, 3], streamed
    assert "final: loss" in streamed.output, streamed


def test_rank_0_killed_while_saving_is_survived_and_its_temporary_removed(tmp_path):
    folder = tmp_path / "ckpt"
    job = train("--steps", "15", "--checkpoint-dir", str(folder), "--checkpoint-every", "5",
                "--kill", "0@10:checkpoint", ranks=3, ft=True)
    assert job.returncode == 0 and "lost rank(s) [0]" in job.output, job
    assert sorted(os.listdir(folder)) == ["ckpt-000000005.npz", "ckpt-000000015.npz"]  # step 10's temporary too


def test_checkpoint_keep_sets_how_many_checkpoints_each_folder_keeps(tmp_path):
    from hpcreduce.ft.checkpoint_files import checkpoints
    ring, ps = tmp_path / "ring", tmp_path / "ps"
    for folder, mode in ((ring, ()), (ps, ("--mode", "ps", "--servers", "1"))):
        job = train(*mode, "--steps", "8", "--checkpoint-dir", str(folder), "--checkpoint-every", "2",
                    "--checkpoint-keep", "3", ranks=3)
        assert job.returncode == 0, job
    assert [step for step, _ in checkpoints(str(ring))] == [4, 6, 8]
    assert [step for step, _ in checkpoints(str(ps / "ps-shard-0"))] == [4, 6, 8]
    refused = train("--checkpoint-dir", str(ring), "--checkpoint-every", "2", "--checkpoint-keep", "1")
    assert refused.returncode == 2 and "--checkpoint-keep must be at least 2, got 1" in refused.output, refused
