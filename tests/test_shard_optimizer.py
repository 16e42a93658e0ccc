"""``hpcreduce train --shard-optimizer`` (ZeRO-1 for the ring): the same run as without it, and
refused by name where it cannot apply."""
import json

import pytest

from mpi_run import hpcreduce_cli


def _run(tmp_path, name, *args):
    path = tmp_path / f"{name}.json"
    job = hpcreduce_cli("train", *args, "--quiet", "--json", str(path), timeout=180)
    assert job.returncode == 0, job.output[-2000:]
    result = json.loads(path.read_text())
    return [(s["loss"], s["accuracy"]) for s in result["steps"]], result["final"]


@pytest.mark.parametrize("ranks, model, optimizer", [("2", "mlp", "momentum"), ("3", "logreg", "adam")])
def test_sharded_optimizer_state_gives_the_unsharded_run(tmp_path, ranks, model, optimizer):
    args = ("-n", ranks, "--model", model, "--optimizer", optimizer, "--steps", "4", "--batch", "256")
    whole = _run(tmp_path, "whole", *args)
    sharded = _run(tmp_path, "sharded", *args, "--shard-optimizer")
    assert sharded == whole  # every step's loss and accuracy, the final parameters' checksum


@pytest.mark.parametrize("extra, named", [(("--mode", "ps", "--servers", "1"), "applies to --mode ring"),
                                          (("--checkpoint-dir", "CKPT"), "--checkpoint-dir")])
def test_refused_by_name_where_it_cannot_apply(tmp_path, extra, named):
    extra = tuple(str(tmp_path / "ckpt") if arg == "CKPT" else arg for arg in extra)
    job = hpcreduce_cli("train", "-n", "3", "--steps", "2", "--shard-optimizer", *extra, timeout=60)
    assert job.returncode != 0
    assert "--shard-optimizer" in job.output and named in job.output, job.output[-2000:]
