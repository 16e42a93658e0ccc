"""A torch model trained with fault tolerance: examples/torch_recsys.py --ft-trainer (the DLRM-like
module as ``hpcreduce.torch.TorchModel``, trained by ``hpcreduce.train``'s hybrid trainer) under
real mpirun with ULFM, 2 servers and 3 workers, one rank SIGKILLed at step 10: the run ends
with exit 0, the recovery recorded, every live worker's dense replica identical and all steps in,
and the held-out loss lower than the start's. A BSP run that loses a server ends where the same
run without a kill ends (the interrupted step is redone: summation order only); a replacement
for a killed worker (--replace) joins with the dense replica the others hold. A ``features_of`` that
misreports the ids stops every rank with a PSTrainingError naming it (tests/mpi/torch_model_errors.py).
A table's ``init_fn`` starts its rows under the hybrid and ring trainers, and ranks that built the
module from different random states still train one model (tests/mpi/torch_model_init.py)."""
import json
from pathlib import Path

import pytest

from mpi_run import mpirun

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torch_recsys.py"
STEPS = 40
RUN = ("--servers", "2", "--ft-trainer", "--steps", str(STEPS), "--batch", "128", "--examples", "20000")


def run(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    job = mpirun(5, str(EXAMPLE), *RUN, *args, "--json", str(out), ft=True, timeout=60)
    assert job.returncode == 0, job
    return job, json.loads(out.read_text())


def assert_survived(job, data, killed, workers):
    assert f"ranks lost [[{killed}]]" in job.output, job
    assert data["ranks"] == 4 and [event["kind"] for event in data["recovery"]] == ["failure"], data["recovery"]
    assert data["recovery"][0]["lost"] == [killed]
    hybrid = data["ps"]["hybrid"]
    assert hybrid["dense_identical"] and len(set(hybrid["dense_checksums"])) == 1, hybrid
    assert hybrid["dense_steps_applied"] == [STEPS] * workers, hybrid
    assert data["final"]["loss"] < data["start"]["loss"] - 0.015, (data["start"], data["final"])


def test_a_sigkilled_worker_is_survived(tmp_path):
    job, data = run(tmp_path, "worker", "--consistency", "ssp", "--kill", "4@10")
    assert_survived(job, data, killed=4, workers=2)
    assert data["recovery"][0]["lost_workers"] == [4]


def test_a_sigkilled_server_is_survived_and_bsp_ends_where_it_would_have(tmp_path):
    _, reference = run(tmp_path, "reference", "--consistency", "bsp")
    assert reference["recovery"] == []
    job, data = run(tmp_path, "server", "--consistency", "bsp", "--kill", "1@10")
    assert_survived(job, data, killed=1, workers=3)
    assert data["recovery"][0]["lost_servers"] == [1]
    assert data["final"]["checksum"] == pytest.approx(reference["final"]["checksum"], rel=1e-5)
    assert data["final"]["loss"] == pytest.approx(reference["final"]["loss"], abs=1e-4)


def test_a_replacement_for_a_killed_worker_gets_the_dense_replica(tmp_path):
    job, data = run(tmp_path, "replaced", "--consistency", "ssp", "--kill", "3@10", "--replace")
    assert [event["kind"] for event in data["recovery"]] == ["failure", "replacement"], data["recovery"]
    assert data["ranks"] == 5 and "ranks lost [[3]]" in job.output, job
    hybrid = data["ps"]["hybrid"]
    assert hybrid["dense_identical"] and hybrid["dense_steps_applied"] == [STEPS] * 3, hybrid
    assert data["final"]["loss"] < data["start"]["loss"] - 0.015, (data["start"], data["final"])


def test_features_of_that_misreports_the_ids_stops_every_rank_by_name():
    job = mpirun(4, "torch_model_errors.py", timeout=60)
    assert job.returncode == 0, job
    assert "torch model errors: all checks passed" in job.output, job


def test_an_init_fn_starts_the_tables_and_ranks_built_apart_train_one_model():
    job = mpirun(4, "torch_model_init.py", timeout=90)
    assert job.returncode == 0, job
    assert "torch model init_fn: all checks passed" in job.output, job
