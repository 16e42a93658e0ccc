"""Files and folders a user points us at may be shared, and anyone's: we never delete what we
did not write nor through a link, never write through another user's link, and never read
more than we checked (a FIFO or device is refused, not waited on; an array's header is checked
against the bytes there before anything is allocated)."""
import io
import json
import os
import threading
import tracemalloc
import zipfile

import numpy as np
import pytest

from hpcreduce.errors import InputFileError, LaunchError, OutputFileError, worded
from hpcreduce.ft import checkpoint_files as checkpoint
from hpcreduce.ft.resize import read_discovery
from hpcreduce.runtime import files
from hpcreduce.runtime.given_files import inside
from hpcreduce.runtime.hosts import hostfile_slots
from hpcreduce.torch.embedding_configs import EmbeddingBagConfig
from hpcreduce.torch import table_files
from hpcreduce.torch.table_files import saved_problem
from hpcreduce.train.data_dir import DirDataset, shard_file, write_data_dir
from hpcreduce.train.models import SyntheticCTR
from hpcreduce.train.ps import export, ledger, shard_checkpoints

OTHER_USER = 65534  # nobody
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")


def _precious(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    for name in (".bashrc", "worker-0.bin", "notes"):
        (precious / name).write_text("mine\n")
    return precious


def test_a_resume_never_deletes_through_a_linked_ledger_folder_nor_what_it_did_not_write(tmp_path):
    precious = _precious(tmp_path)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ledger.FOLDER).symlink_to(precious)
    ledger.remove_ledgers(str(linked))
    assert sorted(os.listdir(precious)) == [".bashrc", "notes", "worker-0.bin"]
    assert ledger.read_ledgers(str(linked), pytest.fail) == []
    failed = []
    ledger.PushLedger(str(linked), 0, 0, failed.append)  # never written through the link either
    assert "symlink" in str(failed[0]) and (precious / "worker-0.bin").read_text() == "mine\n"
    folder = tmp_path / "ckpt" / ledger.FOLDER
    folder.mkdir(parents=True)
    for slot in (0, 1):
        ledger.PushLedger(str(tmp_path / "ckpt"), slot, 0, pytest.fail).close()
    (folder / "notes.txt").write_text("a user's\n")
    (folder / "worker-7.bin").symlink_to(precious / "notes")
    os.mkfifo(folder / "worker-8.bin")  # read, it would block rank 0 for ever
    warned = []
    assert [slot for _, slot, _ in ledger.read_ledgers(str(tmp_path / "ckpt"), warned.append)] == [0, 1]
    assert "worker-8.bin is a FIFO" in warned[-1]
    ledger.remove_ledgers(str(tmp_path / "ckpt"))
    assert sorted(os.listdir(folder)) == ["notes.txt", "worker-7.bin", "worker-8.bin"]
    assert (precious / "notes").read_text() == "mine\n"


def test_removing_newer_shard_checkpoints_never_follows_a_linked_shard_folder(tmp_path):
    precious = tmp_path / "precious"
    checkpoint.save(str(precious), 9, {"w": np.ones(3)}, {"keys": [0]})
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "ps-shard-0").symlink_to(precious)
    assert shard_checkpoints.remove_newer(str(tmp_path / "ckpt"), 0) == []
    assert os.listdir(precious) == ["ckpt-000000009.npz"]


@as_root
@pytest.mark.parametrize("planted", ["run.json", "folder"])
def test_another_users_planted_link_is_refused_by_name_never_written_through(tmp_path, planted):
    victim = tmp_path / "bashrc"
    victim.write_text("export PATH\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    link = shared / planted
    link.symlink_to(victim if planted == "run.json" else tmp_path)
    os.lchown(link, OTHER_USER, OTHER_USER)
    path = link if planted == "run.json" else link / "bashrc"
    with pytest.raises(OutputFileError, match=f"{link} is a symlink owned by uid {OTHER_USER}, another user"):
        files.write_json(str(path), {"x": 1})
    with pytest.raises(OutputFileError, match="another user"):
        files.LineStream(str(path), fresh=True)
    assert "another user" in files.path_problem(str(path))
    with pytest.raises(OSError, match="another user"):
        table_files._written(str(path), (2, 2))  # save_tables maps its files to write them in place
    assert victim.read_text() == "export PATH\n"
    os.lchown(link, os.geteuid(), os.getegid())  # our own link is followed, as before
    files.write_json(str(path), [1])
    assert link.is_symlink() and json.loads(victim.read_text()) == [1]


@as_root
def test_a_planted_checkpoint_link_of_another_user_is_refused_and_its_target_kept(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "ckpt").mkdir()
    planted = tmp_path / "ckpt" / "ckpt-000000010.npz"
    planted.symlink_to(victim)
    os.lchown(planted, OTHER_USER, OTHER_USER)
    with pytest.raises(OutputFileError, match="another user"):
        checkpoint.save(str(tmp_path / "ckpt"), 10, {"w": np.ones(3)}, {})
    assert victim.read_text() == "keep\n"


def _npz_with_header(path, shape, data_bytes=64):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    metadata = io.BytesIO()
    np.save(metadata, np.frombuffer(b'{"step": 10}', dtype=np.uint8))
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("w.npy", header.getvalue() + b"\0" * data_bytes)
        out.writestr(f"{checkpoint.METADATA_KEY}.npy", metadata.getvalue())


@pytest.mark.parametrize("damage", ["huge header", "compressed", "fifo", "wrapped shape"])
def test_a_checkpoint_claiming_more_than_it_holds_is_passed_over_without_allocating_it(tmp_path, damage):
    checkpoint.save(str(tmp_path), 5, {"w": np.ones(4)}, {})
    newest = tmp_path / "ckpt-000000010.npz"
    if damage == "huge header":
        _npz_with_header(newest, (1 << 40,))  # numpy would raise _ArrayMemoryError, not passed over
    elif damage == "wrapped shape":
        _npz_with_header(newest, (1 << 32, 1 << 32), 0)  # its int64 product is 0
    elif damage == "compressed":
        np.savez_compressed(newest, w=np.zeros(64 << 20, np.uint8), __metadata__=np.frombuffer(b'{"step": 10}', np.uint8))
    else:
        os.mkfifo(newest)
    warned = []
    tracemalloc.start()
    found = checkpoint.load_latest(str(tmp_path), warned.append)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert found[0]["step"] == 5 and len(warned) == 1 and str(newest) in warned[0], warned
    assert peak < 8 << 20, peak


def test_finding_the_latest_complete_ps_checkpoint_streams_its_shards(tmp_path):
    for key in (0, 1, 2):
        checkpoint.save(shard_checkpoints.folder(str(tmp_path), key), 4, {"values": np.ones(4 << 20)},
                        {"keys": [0, 1, 2]})  # 32 MiB a shard
    tracemalloc.start()
    step = shard_checkpoints.latest_complete(str(tmp_path), pytest.fail)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert step == 4 and peak < 8 << 20, peak
    with open(shard_checkpoints.folder(str(tmp_path), 1) + "/ckpt-000000004.npz", "r+b") as damaged:
        damaged.seek(20 << 20)
        damaged.write(b"\1")
    warned = []
    assert shard_checkpoints.latest_complete(str(tmp_path), warned.append) is None and "Bad CRC" in warned[0]


def discovered(path: str) -> str:
    return read_discovery(path)


def hostfile_refusal(path: str) -> str:
    try:
        return f"read {hostfile_slots(path)} slots"
    except LaunchError as err:
        return str(err)


@pytest.mark.parametrize("reader, said", [(discovered, "cannot read it"), (hostfile_refusal, "cannot read hostfile")])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "huge"])
def test_a_discovery_file_or_hostfile_that_is_a_fifo_a_device_or_huge_is_a_problem_not_a_wait(tmp_path, kind,
                                                                                            reader, said):
    path = tmp_path / "ranks"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        path.write_text("localhost slots=4\n" + "#" * (2 << 20))
    else:
        path.symlink_to(kind)
    found = []
    thread = threading.Thread(target=lambda: found.append(reader(str(path))), daemon=True)
    thread.start()
    thread.join(20)
    assert found and said in found[0], found


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/b", "..", "", 3])
def test_a_name_read_from_a_file_stays_inside_its_folder(tmp_path, name):
    with pytest.raises(ValueError, match="is not a file name inside"):
        inside(str(tmp_path), name)


def test_a_data_manifest_whose_shape_product_wraps_or_names_a_path_outside_is_refused(tmp_path):
    path = str(tmp_path / "data")
    write_data_dir(SyntheticCTR(2, train_examples=64, test_examples=16, fields=4, hash_bits=6), path, train_shards=2,
                   test_shards=1)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    huge = {**manifest, "arrays": {**manifest["arrays"], "ids": {"dtype": "int64", "shape": [1 << 32, 1 << 32]}}}
    for split, shards in manifest["splits"].items():  # files whose headers claim it, with no data at all
        for shard in range(len(shards)):
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                header, {"descr": "<i8", "fortran_order": False, "shape": (shards[shard], 1 << 32, 1 << 32)})
            (tmp_path / "data" / shard_file(split, shard, "ids")).write_bytes(b"\x93NUMPY" + header.getvalue()[6:])
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(huge))
    problems = [worded(p) for p in DirDataset(path, ("ids",)).problems(0, 1)]
    assert problems and all("is truncated (0 of" in text for text in problems), problems
    outside = {**manifest, "arrays": {"../../../etc/x": {"dtype": "int64", "shape": [1]}}}
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(outside))
    problems = [worded(p) for p in DirDataset(path).problems(0, 1)]
    assert any("'../../../etc/x' is not a plain name" in text for text in problems), problems


def test_an_exported_model_manifest_naming_a_file_outside_its_folder_is_refused(tmp_path):
    outside = tmp_path / "secret.npz"
    np.savez(outside, **{"t0.values": np.ones(4)})
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.json").write_text(json.dumps({
        "format": export.FORMAT, "identity": {"parameters": {"w": {"shape": [4], "dtype": "float64", "sparse": False}}},
        "step": 1, "pieces": {"0": [[0, 0, 4]]}, "shards": {"0": str(outside)}}))
    with pytest.raises(InputFileError, match="is not a file name inside"):
        export.whole_model(str(model))


def _saved_tables(directory, trainers=2, rows=5, dim=3):
    os.makedirs(directory, exist_ok=True)
    for r in range(trainers):
        np.lib.format.open_memmap(os.path.join(directory, f"t.{r}-of-{trainers}.npy"), mode="w+",
                                  dtype=np.float32, shape=(len(range(r, rows, trainers)), dim)).flush()
    with open(os.path.join(directory, "tables.json"), "w") as meta:
        json.dump({"trainers": trainers, "tables": {"t": [rows, dim]}}, meta)
    return [EmbeddingBagConfig(num_embeddings=rows, embedding_dim=dim, name="t", feature_names=["f"])]


@pytest.mark.parametrize("damage", ["missing", "cut", "other shape", "fifo"])
def test_saved_tables_with_a_file_missing_or_cut_are_refused_at_start_whatever_the_sharding(tmp_path, damage):
    directory = str(tmp_path / "tables")
    configs = _saved_tables(directory)
    assert saved_problem(directory, configs) is None
    victim = os.path.join(directory, "t.1-of-2.npy")
    if damage == "missing":
        os.unlink(victim)
    elif damage == "cut":
        os.truncate(victim, os.path.getsize(victim) - 4)
    elif damage == "other shape":
        np.save(victim, np.zeros((2, 4), np.float32))
    else:
        os.unlink(victim)
        os.mkfifo(victim)
    problem = saved_problem(directory, configs)
    assert problem and "t.1-of-2.npy" in problem, problem
