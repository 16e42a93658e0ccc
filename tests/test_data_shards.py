"""Data sharded per worker: the shard stream (``train.partition``), data directories
(``train.data_dir``, ``hpcreduce data write``, ``--data DIR``), and shards reassigned when
PS workers die or join, under real mpirun with a SIGKILL."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpi_run import hpcreduce_cli, mpirun, run_job

from hpcreduce.errors import OutputFileError, worded
from hpcreduce.runtime.launch import build_mpirun
from hpcreduce.train.data_dir import DirDataset, shard_file, write_data_dir
from hpcreduce.train.models import SyntheticCTR
from hpcreduce.train.partition import (assignment, even_shards, global_batch, owned_shards, shard_examples,
                                       shard_layout, shard_order, share_bounds, worker_batch)

TIMEOUT = 180


@pytest.mark.parametrize("sizes, batch", [((250,) * 4, 64), ((30, 31, 29), 30), ((4, 3, 3), 25), ((7,), 7),
                                          (even_shards(100, 64), 5)])
def test_each_shard_walks_through_its_own_reshuffled_epochs(sizes, batch):
    steps = 3 * sum(sizes) // batch + 2
    batches = [global_batch(t, batch, sizes, seed=4) for t in range(steps)]
    assert all(len(indices) == batch for indices in batches)
    _, firsts = shard_layout(sizes)
    for shard, size in enumerate(sizes):
        stream = np.concatenate([shard_examples(t, batch, sizes, 4, shard) for t in range(steps)]) - firsts[shard]
        epochs = [stream[e * size:(e + 1) * size] for e in range(len(stream) // size)]
        assert len(epochs) >= 2
        for epoch, order in enumerate(epochs):
            assert np.array_equal(order, shard_order(size, 4, shard, epoch))  # each example once per epoch
    stream = np.concatenate(batches)
    counts = np.bincount(np.searchsorted(firsts, stream, side="right") - 1, minlength=len(sizes))
    assert counts.max() - counts.min() <= 1  # shards dealt round-robin, whatever the batch
    assert np.array_equal(global_batch(2, batch, sizes, seed=4), batches[2])
    assert not np.array_equal(global_batch(0, batch, sizes, seed=5), batches[0])


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12), batch=st.integers(1, 200),
       step=st.integers(0, 50), workers=st.integers(1, 15))
def test_worker_shares_are_their_shards_and_cover_the_global_batch_whatever_the_worker_count(
        sizes, batch, step, workers):
    indices = global_batch(step, batch, sizes, seed=1)
    _, firsts = shard_layout(sizes)
    shares = [worker_batch(step, w, workers, batch=batch, shards=sizes, seed=1) for w in range(workers)]
    assert np.array_equal(np.sort(np.concatenate(shares)), np.sort(indices))  # each example once
    for w, share in enumerate(shares):
        owned = owned_shards(w, workers, sizes)
        assert set(np.searchsorted(firsts, share, side="right") - 1) <= set(owned)
    if len(sizes) % workers == 0:  # every worker computes its fair share of every step
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    plan = assignment(list(range(100, 100 + workers)), sizes)
    assert [identity for identity, _ in plan] == list(range(100, 100 + workers))
    assert sorted(shard for _, owned in plan for shard in owned) == list(range(len(sizes)))


def test_partition_refuses_bad_arguments():
    with pytest.raises(ValueError, match="worker must be in"):
        share_bounds(10, 3, 3)
    with pytest.raises(ValueError, match="batch >= 1"):
        global_batch(0, 0, 10, seed=0)
    with pytest.raises(ValueError, match="at least one example"):
        shard_layout([5, 0, 2])
    assert shard_order(10, 0, 0, 0).flags.writeable is False
    assert even_shards(3) == (1, 1, 1) and sum(even_shards(10_001)) == 10_001


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    source = SyntheticCTR(2, train_examples=1000, test_examples=300, fields=4, hash_bits=10)
    path = str(tmp_path_factory.mktemp("data") / "ctr")
    write_data_dir(source, path, train_shards=7, test_shards=2)
    return source, path


def test_a_directory_reads_back_its_source_and_opens_only_the_shards_touched(written):
    source, path = written
    data = DirDataset(path, ("ids", "label"))
    assert data.shard_sizes("train") == even_shards(1000, 7) and data.size("test") == 300
    assert data.info()["bayes_accuracy"] == source.bayes_accuracy and data.problems(0, 1) == []
    indices = np.array([999, 3, 500, 142, 143, 0])
    for split in ("train", "test"):
        batch = data.batch(split, indices[indices < data.size(split)])
        expected = source.batch(split, indices[indices < data.size(split)])
        assert all(np.array_equal(batch[key], expected[key]) and batch[key].dtype == expected[key].dtype
                   for key in expected)
    _, firsts = shard_layout(data.shard_sizes("train"))
    touched = set(np.searchsorted(firsts, indices, side="right") - 1)
    assert {shard for split, shard in data.opened if split == "train"} == touched
    with pytest.raises(OutputFileError, match="not empty"):
        write_data_dir(source, path, train_shards=2, test_shards=1)


def broken_copy(path, tmp_path, name, change):
    copy = tmp_path / name
    copy.mkdir()
    for entry in os.listdir(path):
        (copy / entry).write_bytes((open(os.path.join(path, entry), "rb")).read())
    change(copy)
    return str(copy)


def rewrite_manifest(copy, **fields):
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, **fields}))


@pytest.mark.parametrize("name, change, message", [
    ("missing", lambda d: (d / shard_file("train", 5, "ids")).unlink(), "train-00005.ids.npy is missing"),
    ("dtype", lambda d: np.save(d / shard_file("test", 1, "label"), np.zeros(150, np.int32)),
     "test-00001.label.npy holds int32 [150]; the manifest says float32 [150]"),
    ("rows", lambda d: rewrite_manifest(d, splits={"train": [143] * 7, "test": [150, 150]}),
     "holds int64 [142, 4]; the manifest says int64 [143, 4]"),
    ("truncated", lambda d: (d / shard_file("train", 2, "ids")).write_bytes(
        (d / shard_file("train", 2, "ids")).read_bytes()[:-8]), "train-00002.ids.npy is truncated"),
    ("garbage", lambda d: (d / shard_file("train", 0, "label")).write_bytes(b"nope"), "not a readable .npy"),
    ("no manifest", lambda d: (d / "manifest.json").unlink(), "has no manifest.json"),
    ("format", lambda d: rewrite_manifest(d, version=9), "is not format 'hpcreduce-data' version 1"),
    ("empty shard", lambda d: rewrite_manifest(d, splits={"train": [0], "test": [300]}), "needs 1 or more rows"),
    ("bad spec", lambda d: rewrite_manifest(d, arrays={"ids": {"dtype": "nope", "shape": [4]},
                                                       "label": {"dtype": "float32", "shape": []}}),
     "array 'ids' has an unknown dtype 'nope'"),
])
def test_a_broken_directory_is_named_whichever_rank_checks_the_broken_file(written, tmp_path, name, change,
                                                                             message):
    _, path = written
    data = DirDataset(broken_copy(path, tmp_path, name.replace(" ", "-"), change), ("ids", "label"))
    whole = [worded(problem, {"data": "--data"}) for problem in data.problems(0, 1)]
    assert any(message in text for text in whole) and all(text.startswith("--data ") for text in whole), whole
    parts = [worded(problem) for part in range(5) for problem in data.problems(part, 5)]
    assert message in " ".join(parts)


def test_a_directory_for_another_model_and_a_missing_one_are_named(written, tmp_path):
    _, path = written
    (problem,) = DirDataset(path, ("x", "label")).problems(0, 1)
    assert "holds arrays ids, label; the model reads x, label (missing x)" in worded(problem)
    (problem,) = DirDataset(str(tmp_path / "none")).problems(1, 3)
    assert worded(problem).endswith("none: is not a directory")


def test_data_write_refuses_bad_flags_once(tmp_path):
    (tmp_path / "kept").write_text("mine")
    job = hpcreduce_cli("data", "write", str(tmp_path), "--shards", "0", "--model", "x", timeout=60)
    assert job.returncode == 2 and (tmp_path / "kept").read_text() == "mine", job
    for message in ("--shards and --test-shards must be at least 1", "--model must be one of",
                    f"DIR {tmp_path} exists and is not an empty directory"):
        assert job.output.count(f"hpcreduce data: {message}") == 1, job


def test_a_directory_trains_like_generated_data_alone_in_a_ring_and_with_a_server(tmp_path):
    job = mpirun(3, "data_shards.py", str(tmp_path), timeout=TIMEOUT)
    assert job.returncode == 0 and "data shards: ok" in job.output, job


def test_a_killed_worker_s_shards_are_reassigned_in_ring_and_ps_and_a_newcomer_takes_a_share(tmp_path):
    data = tmp_path / "ctr"
    written = hpcreduce_cli("data", "write", str(data), "--examples", "20000", "--shards", "12", timeout=60)
    assert written.returncode == 0 and "20000 training examples in 12 shards" in written.output, written
    common = ("train", "--data", str(data), "--steps", "24", "--batch", "512", "--seed", "3")
    ring = hpcreduce_cli(*common, "-n", "3", "--ft", "--kill", "2@12", "--json", str(tmp_path / "ring.json"),
                         timeout=TIMEOUT)
    assert ring.returncode == 0, ring
    reference = json.loads((tmp_path / "ring.json").read_text())
    (lost,) = reference["recovery"]
    assert lost["lost"] == [2] and lost["data_shards"] == [[0, [0, 2, 4, 6, 8, 10]], [1, [1, 3, 5, 7, 9, 11]]], lost
    job = hpcreduce_cli(*common, "-n", "5", "--mode", "ps", "--servers", "2", "--ft", "--kill", "4@8",
                        "--grow", "1@16", "--json", str(tmp_path / "ps.json"), timeout=TIMEOUT)
    assert job.returncode == 0, job
    result = json.loads((tmp_path / "ps.json").read_text())
    failure, growth = result["recovery"]
    assert failure["kind"] == "failure" and failure["lost_workers"] == [4], failure
    assert failure["data_shards"] == [[2, [0, 2, 4, 6, 8, 10]], [3, [1, 3, 5, 7, 9, 11]]], failure  # id 4's went
    assert growth["kind"] == "growth" and growth["joined"] == [5], growth
    assert growth["data_shards"] == [[2, [0, 3, 6, 9]], [3, [1, 4, 7, 10]], [5, [2, 5, 8, 11]]], growth
    redone = failure["restart_step"]  # BSP: every step from it on was computed by the survivors, whole
    assert [step["examples"] for step in result["steps"][redone - 1:]] == [512] * (24 - redone + 1), result["steps"]
    final = reference["final"]  # the same global batches, whoever computed them
    assert result["final"]["loss"] == pytest.approx(final["loss"], rel=1e-4)
    assert result["final"]["checksum"] == pytest.approx(final["checksum"], rel=1e-4)
    assert result["dataset"]["train_shards"] == 12 and result["dataset"]["path"] == str(data)


def test_a_broken_data_directory_is_refused_once_with_status_2_from_the_launcher_and_under_mpirun(tmp_path):
    job = hpcreduce_cli("train", "-n", "2", "--data", str(tmp_path / "none"), timeout=60)
    assert job.returncode == 2 and job.output.count("--data") == 1 and "is not a directory" in job.output, job
    plan = build_mpirun(2, [sys.executable, "-m", "hpcreduce", "train", "--data", str(tmp_path)])
    job = run_job(plan.argv, timeout=60, env=plan.env)
    assert job.returncode == 2 and job.output.count(f"--data {tmp_path}: has no manifest.json") == 1, job


CUT_WHILE_READ = """
import os, sys
import numpy as np
from hpcreduce.errors import InputFileError
from hpcreduce.train.data_dir import DirDataset, shard_file
data = DirDataset(sys.argv[1], ("ids", "label"))
data.batch("train", np.arange(0, 10))  # shard 0 mapped
os.truncate(os.path.join(sys.argv[1], shard_file("train", 0, "ids")), 1000)  # a read past the end: SIGBUS
os.truncate(os.path.join(sys.argv[1], shard_file("train", 3, "label")), 100)  # not mapped yet
for first in (0, 3 * 143):
    try:
        data.batch("train", np.arange(first, first + 10))
    except InputFileError as err:
        print(err)
"""


def test_a_shard_cut_while_the_run_reads_it_is_named_not_a_sigbus(written, tmp_path):
    _, path = written
    copy = broken_copy(path, tmp_path, "cut", lambda d: None)
    job = run_job([sys.executable, "-c", CUT_WHILE_READ, copy], timeout=60)
    assert job.returncode == 0, job
    cut, unmapped = job.output.strip().splitlines()
    assert cut.startswith(f"data shard file {copy}/train-00000.ids.npy was cut to 1000 bytes while the run read it")
    assert unmapped.startswith(f"data directory {copy}: shard file train-00003.label.npy is not a readable .npy")


def test_a_shard_cut_during_training_stops_every_rank_naming_it(tmp_path):
    data = tmp_path / "ctr"
    assert hpcreduce_cli("data", "write", str(data), "--examples", "4000", "--shards", "4", timeout=60).returncode == 0
    metrics = tmp_path / "metrics.jsonl"
    job = [sys.executable, "-m", "hpcreduce", "train", "-n", "2", "--data", str(data), "--steps", "2000",
           "--batch", "64", "--quiet", "--metrics", str(metrics)]
    process = subprocess.Popen(job, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and process.poll() is None:
            time.sleep(0.05)
        for shard in range(4):  # every shard the next batches touch, mapped or not
            os.truncate(data / shard_file("train", shard, "ids"), 200)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 1 and "Traceback" not in output and "SIGBUS" not in output, output
    stopped = [line for line in output.splitlines() if "training stopped at step" in line]
    assert len(stopped) == 2 and all(f"{data}" in line and "train-0000" in line for line in stopped), output
