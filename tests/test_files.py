"""Output files (``runtime.files``) and checkpoint files (``ft.checkpoint_files``) on their own:
what a path leads to is written there (devices and FIFOs through, symlinks followed),
failures are ``OutputFileError``s naming the path, torn checkpoints are passed over,
stale temporaries of dead writers are removed and live writers' never."""
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from hpcreduce.errors import OutputFileError
from hpcreduce.ft import checkpoint_files as checkpoint
from hpcreduce.runtime import files


def test_a_new_path_and_a_regular_file_are_replaced_whole(tmp_path):
    path = tmp_path / "deep" / "result.json"
    files.write_json(str(path), {"a": 1})
    files.write_json(str(path), {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(path.parent) == ["result.json"]


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    (tmp_path / "out").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "out" / "target.json")  # dangling until written
    files.write_json(str(link), [1])
    files.write_json(str(link), [2])
    assert link.is_symlink() and json.loads((tmp_path / "out" / "target.json").read_text()) == [2]
    assert sorted(os.listdir(tmp_path / "out")) == ["target.json"]


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    files.write_json(str(fifo), {"through": True})
    reader.join(10)
    assert json.loads(got[0]) == {"through": True} and fifo.is_fifo()
    assert os.listdir(tmp_path) == ["pipe"]


def test_dev_stdout_is_written_through_and_dev_null_stays_a_device(tmp_path):
    code = ("from hpcreduce.runtime.files import write_json, LineStream\n"
            "write_json('/dev/stdout', {'x': 1}); s = LineStream('/dev/stdout', fresh=True)\n"
            "s.write_line('{}'); s.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.splitlines() == ["{", ' "x": 1', "}", "{}"]
    files.write_json("/dev/null", {"x": 1})
    with files.atomic_file("/dev/null", "wb") as raw:
        raw.write(b"x")
    assert not os.path.isfile("/dev/null")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_write_error_names_the_path_and_the_reason():
    with pytest.raises(OutputFileError, match="cannot write /dev/full: No space left on device"):
        files.write_json("/dev/full", {"x": 1})
    stream = files.LineStream("/dev/full", fresh=True)
    with pytest.raises(OutputFileError, match="/dev/full: No space left"):
        stream.write_line("{}")
    stream.close()  # already closed by the failure: nothing more raised


def test_a_folder_in_the_way_is_a_clear_error_and_leaves_nothing(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(OutputFileError, match="taken: Is a directory"):
        files.write_json(str(tmp_path / "taken"), {})
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputFileError, match="file/r.json"):
        files.write_json(str(tmp_path / "file" / "r.json"), {})
    assert sorted(os.listdir(tmp_path)) == ["file", "taken"] and os.listdir(tmp_path / "taken") == []


def test_an_error_in_the_block_keeps_the_previous_file(tmp_path):
    path = tmp_path / "r.json"
    files.write_json(str(path), "old")
    with pytest.raises(TypeError):
        files.write_json(str(path), object())
    assert json.loads(path.read_text()) == "old" and os.listdir(tmp_path) == ["r.json"]


def test_only_temporaries_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    host = files._host()
    names = {"stale": f".ckpt-000000010.npz.{host}.{dead}.abc_1.partial",
             "mine": f".ckpt-000000010.npz.{host}.{os.getpid()}.abc_2.partial",
             "elsewhere": f".ckpt-000000010.npz.otherhost.{dead}.abc_3.partial",
             "user": "ckpt-notes.partial"}
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    removed = files.remove_stale_temporaries(str(tmp_path))
    assert removed == [str(tmp_path / names["stale"])]
    assert sorted(os.listdir(tmp_path)) == sorted(v for k, v in names.items() if k != "stale")


def test_path_problem_follows_links_and_accepts_devices(tmp_path):
    assert files.path_problem("/dev/stdout") is None
    assert files.path_problem(str(tmp_path)) == "not a writable file path"
    (tmp_path / "link").symlink_to(tmp_path)
    assert files.path_problem(str(tmp_path / "link")) == "not a writable file path"


def _save(folder, step, value=1.0, **identity):
    return checkpoint.save(str(folder), step, {"w": np.full(1000, value)},
                           {"ranks": 2, "identity": {"seed": 0, **identity}})


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage", "flip", "no-metadata", "bad-metadata"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, damage):
    _save(tmp_path, 5, 5.0)
    newest = _save(tmp_path, 10, 10.0)
    data = open(newest, "rb").read()
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "empty":
        data = b""
    elif damage == "garbage":
        data = os.urandom(len(data))
    elif damage == "flip":  # the array's bytes: only its checksum tells
        data = data[:200] + bytes([data[200] ^ 0xFF]) + data[201:]
    else:
        buffer = open(newest, "wb")
        arrays = {"w": np.zeros(3)}
        if damage == "bad-metadata":
            arrays[checkpoint.METADATA_KEY] = np.frombuffer(b"[1, 2]", dtype=np.uint8)
        np.savez(buffer, **arrays)
        buffer.close()
        data = open(newest, "rb").read()
    open(newest, "wb").write(data)
    warnings = []
    metadata, arrays = checkpoint.load_latest(str(tmp_path), warnings.append)
    assert metadata["step"] == 5 and arrays["w"][0] == 5.0
    assert len(warnings) == 1 and "ckpt-000000010.npz is unreadable" in warnings[0], warnings


def test_identity_problem_names_the_first_difference(tmp_path):
    _save(tmp_path, 5, seed=0, model="logreg")
    metadata, _ = checkpoint.load_latest(str(tmp_path))
    assert checkpoint.identity_problem(metadata, {"seed": 0, "model": "logreg"}) is None
    assert checkpoint.identity_problem(metadata, {"seed": 7, "model": "logreg"}) == \
        "was written by a run with seed 0, this run has seed 7"
    assert "without a run identity" in checkpoint.identity_problem({"step": 1}, {"seed": 0})


def test_folder_problem(tmp_path):
    (tmp_path / "file").write_text("x")
    assert files.folder_problem(str(tmp_path / "file")) == "is a file, not a folder"
    assert files.folder_problem(str(tmp_path / "file" / "sub")).startswith("cannot be created:")
    assert files.folder_problem(str(tmp_path / "new" / "deeper")) is None
    assert files.folder_problem(str(tmp_path)) is None
    with pytest.raises(OutputFileError, match="ckpt-000000001.npz"):
        _save(tmp_path / "file", 1)


def test_dev_stdout_redirected_to_a_file_is_appended_to_not_replaced(tmp_path):
    out = tmp_path / "out.txt"
    code = ("import sys; from hpcreduce.runtime.files import write_json\n"
            "print('before', flush=True); write_json('/dev/stdout', 1); print('after', flush=True)")
    with open(out, "w") as handle:
        subprocess.run([sys.executable, "-c", code], stdout=handle, check=True, timeout=60)
    assert out.read_text().split() == ["before", "1", "after"]


def test_a_new_file_gets_the_umask_and_a_replaced_one_keeps_its_mode(tmp_path):
    path = tmp_path / "r.json"
    files.write_json(str(path), 1)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    path.chmod(0o640)
    files.write_json(str(path), 2)
    assert path.stat().st_mode & 0o777 == 0o640
