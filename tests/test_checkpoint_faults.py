"""Checkpoints under faults and bad input, at the lowest layer that shows each: a refused
``load_checkpoint`` changes nothing on any rank, a foreign newest file is passed over on every
rank (never a hang), a step the name cannot hold is refused (tests/mpi/checkpoint_faults.py,
2 ranks); the metadata of every read is validated (one process)."""
import io
import json

import numpy as np
import pytest

from mpi_run import mpirun

from hpcreduce.errors import OutputFileError
from hpcreduce.ft import checkpoint_files

TIMEOUT = 120


def test_torch_checkpoints_refuse_whole_pass_foreign_files_over_and_bound_steps(tmp_path):
    pytest.importorskip("torch")
    result = mpirun(2, "checkpoint_faults.py", str(tmp_path), timeout=TIMEOUT)
    assert result.returncode == 0, result
    for check in ("a_refused_load_changes_nothing_on_any_rank", "a_foreign_newest_file_is_passed_over_on_every_rank",
                  "a_step_the_name_cannot_hold_is_refused_on_every_rank"):
        assert f"ok check_{check}" in result.output, result
    assert result.output.count("ckpt-000000010.pt is unreadable") == 1, result  # rank 0's warning only


@pytest.mark.parametrize("metadata", [[1], {"step": -1}, {"step": True}, {"step": 10**9}, {"step": 3, "ranks": "2"},
                                      {"step": 3, "ranks": 0}, {"step": 3, "identity": 7}])
def test_a_checkpoint_whose_metadata_is_not_a_checkpoints_is_passed_over(tmp_path, metadata):
    checkpoint_files.save(str(tmp_path), 2, {"w": np.ones(2)}, {"ranks": 1, "identity": {}})
    buffer = io.BytesIO()
    np.savez(buffer, w=np.zeros(2), **{checkpoint_files.METADATA_KEY: np.frombuffer(json.dumps(metadata).encode(),
                                                                                     np.uint8)})
    (tmp_path / "ckpt-000000003.npz").write_bytes(buffer.getvalue())
    warnings = []
    found = checkpoint_files.load_latest(str(tmp_path), warnings.append)
    assert found is not None and found[0]["step"] == 2 and found[1]["w"].tolist() == [1, 1]
    assert len(warnings) == 1 and "ckpt-000000003.npz is unreadable" in warnings[0], warnings


@pytest.mark.parametrize("step", [-1, 10**9, 2.0])
def test_a_step_the_file_name_cannot_hold_is_refused_before_anything_is_written(tmp_path, step):
    with pytest.raises(OutputFileError, match="a checkpoint's step is an integer from 0 to 999999999"):
        checkpoint_files.save(str(tmp_path), step, {"w": np.ones(2)}, {})
    assert list(tmp_path.iterdir()) == []


def test_a_run_whose_steps_a_checkpoint_name_cannot_hold_is_refused_before_it_starts():
    from hpcreduce.errors import worded
    from hpcreduce.ft.faults import FaultConfig
    from hpcreduce.train.config import TrainConfig
    fault = FaultConfig(checkpoint_dir="ckpt", checkpoint_every=5)
    said = [worded(p) for p in TrainConfig(steps=checkpoint_files.MAX_STEP + 1, fault=fault).problems(2, True)]
    assert said == ["checkpoint_dir: a checkpoint's file name holds steps up to 999999999, and steps is 1000000000"]
    assert TrainConfig(steps=checkpoint_files.MAX_STEP, fault=fault).problems(2, True) == []
