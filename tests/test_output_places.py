"""Outputs never destroy inputs (issue 26, class 3) and damaged inputs or odd outputs of
``export`` and ``report`` are clear errors (class 4): every command's outputs go through
``runtime.places``. Refusals start no MPI job; one small PS run makes the model folder."""
import os

import pytest

from hpcreduce.errors import worded
from hpcreduce.runtime.places import Place, place_problems
from hpcreduce.train.data_dir import write_data_dir
from hpcreduce.train.models.ctr_data import SyntheticCTR
from mpi_run import hpcreduce_cli


def test_an_output_may_not_be_or_lie_inside_an_input_or_another_output(tmp_path):
    data = str(tmp_path / "data")
    os.mkdir(data)

    def problems(*places):
        return [worded(problem) for problem in place_problems(places)]
    assert problems(Place("--out", str(tmp_path / "a.npz")), Place("DIR", data, folder=True, output=False)) == []
    assert problems(Place("--json", f"{data}/manifest.json"), Place("--data", data, folder=True, output=False)) == \
        [f"--json {data}/manifest.json lies inside --data {data}, an input of this run: give a path outside it"]
    link = tmp_path / "link"
    link.symlink_to(data)  # compared where links lead
    assert "is --data" in problems(Place("--model-dir", str(link), folder=True),
                                   Place("--data", data, folder=True, output=False))[0]
    assert "a folder this run also writes" in problems(Place("--json", f"{data}/r.json"),
                                                       Place("--checkpoint-dir", data, folder=True))[0]
    assert problems(Place("--json", "/dev/stdout"), Place("--metrics", "/dev/stdout")) == []  # written through
    assert problems(Place("FILE", f"{data}/r.json", output=False), Place("--out", data, folder=True)) == []


def test_a_dangling_symlink_never_creates_folders_and_a_link_to_a_new_file_is_followed(tmp_path):
    from hpcreduce.runtime import files
    (tmp_path / "rel").symlink_to("missing/deeper/out.json")
    (tmp_path / "abs").symlink_to(tmp_path / "gone" / "out.json")
    for name in ("rel", "abs"):
        assert "whose folder does not exist" in files.path_problem(str(tmp_path / name))
        with pytest.raises(files.OutputFileError, match="whose folder does not exist"):
            files.write_json(str(tmp_path / name), 1)
    assert not (tmp_path / "missing").exists() and not (tmp_path / "gone").exists()
    (tmp_path / "new").symlink_to("new.json")
    files.write_json(str(tmp_path / "new"), 1)
    assert (tmp_path / "new").is_symlink() and (tmp_path / "new.json").read_text() == "1\n"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("data") / "ctr")
    write_data_dir(SyntheticCTR(2, train_examples=200, test_examples=50, fields=4, hash_bits=10), path,
                   train_shards=2, test_shards=1)
    return path


@pytest.mark.parametrize("flags, message", [
    (("--json", "{D}/manifest.json"), "--json {D}/manifest.json lies inside --data {D}, an input of this run"),
    (("--mode", "ps", "--model-dir", "{D}"), "--model-dir {D} is --data {D}, an input of this run"),
    (("--checkpoint-dir", "{D}/ckpt"), "--checkpoint-dir {D}/ckpt lies inside --data {D}"),
    (("--timeline", "{D}/train-00000.ids.npy"), "--timeline {D}/train-00000.ids.npy lies inside --data {D}"),
])
def test_train_refuses_an_output_on_its_data_before_launching(data_dir, flags, message):
    manifest = open(os.path.join(data_dir, "manifest.json")).read()
    job = hpcreduce_cli("train", "-n", "2", "--data", data_dir, *(flag.format(D=data_dir) for flag in flags),
                        timeout=60)
    assert job.returncode == 2 and "Traceback" not in job.output and "mpirun" not in job.output, job
    assert job.output.count("hpcreduce train: " + message.format(D=data_dir)) == 1, job.output
    assert open(os.path.join(data_dir, "manifest.json")).read() == manifest
    assert sorted(os.listdir(data_dir)) == ["manifest.json", *(f"{split}-{shard:05d}.{array}.npy" for split, shard in
                                            (("test", 0), ("train", 0), ("train", 1)) for array in ("ids", "label"))]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model") / "model"
    job = hpcreduce_cli("train", "-n", "3", "--mode", "ps", "--servers", "2", "--steps", "3", "--table-rows", "1024",
                        "--quiet", "--model-dir", str(folder), timeout=120)
    assert job.returncode == 0, job
    return folder


def test_export_refuses_an_output_in_its_model_and_writes_devices(model, tmp_path):
    shard = (model / "shard-0.npz").read_bytes()
    into = hpcreduce_cli("export", str(model), "--out", str(model / "shard-0.npz"), timeout=60)
    assert into.returncode == 2 and f"--out {model}/shard-0.npz lies inside DIR {model}" in into.output, into
    assert (model / "shard-0.npz").read_bytes() == shard
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x.npz")
    dangling = hpcreduce_cli("export", str(model), "--out", str(tmp_path / "dangling"), timeout=60)
    assert dangling.returncode == 2 and "whose folder does not exist" in dangling.output, dangling
    assert not (tmp_path / "nowhere").exists()
    null = hpcreduce_cli("export", str(model), "--out", "/dev/null", timeout=60)
    assert null.returncode == 0 and "-> /dev/null" in null.output, null
    full = hpcreduce_cli("export", str(model), "--out", "/dev/full", timeout=60)
    assert full.returncode == 1 and "cannot write /dev/full: No space left on device" in full.output, full
    assert "Traceback" not in null.output + full.output


@pytest.mark.parametrize("name, keep", [("shard-1.npz", 3000), ("manifest.json", 100), ("manifest.json", 40)])
def test_export_of_a_cut_model_file_names_it(model, tmp_path, name, keep):
    copy = tmp_path / "model"
    copy.mkdir()
    for each in os.listdir(model):
        (copy / each).write_bytes((model / each).read_bytes())
    (copy / name).write_bytes((model / name).read_bytes()[:keep])
    job = hpcreduce_cli("export", str(copy), "--out", str(tmp_path / "whole.npz"), timeout=60)
    assert job.returncode == 1 and "Traceback" not in job.output, job
    assert f"hpcreduce export: error: {copy}/{name} is cut or damaged (" in job.output, job
    assert not (tmp_path / "whole.npz").exists()


def test_report_refuses_a_file_in_the_way_of_its_folder_and_its_own_input(tmp_path):
    result = tmp_path / "r.json"
    result.write_text("{}")
    (tmp_path / "taken").write_text("a file")
    job = hpcreduce_cli("report", str(result), "--out", str(tmp_path / "taken"), timeout=60)
    assert job.returncode == 2 and f"--out {tmp_path}/taken: is a file, not a folder" in job.output, job
    job = hpcreduce_cli("report", str(result), "--out", str(result), timeout=60)
    assert job.returncode == 2 and f"--out {result} is FILE {result}, an input of this run" in job.output, job
    assert "Traceback" not in job.output and result.read_text() == "{}"
