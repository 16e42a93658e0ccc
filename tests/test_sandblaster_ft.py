"""Sandblaster fault tolerance (``--mode sandblaster --ft``) with real SIGKILLs under mpirun with ULFM.

5 ranks, K = 2: servers 0 and 1 (slice s also kept on server (s + 1) % 2), coordinator 2,
workers 3 and 4. Each kill fires when the victim first sees iteration 3's passes; the
survivors shrink, re-derive the roles, take the coordinator's newest record from the servers
and redo iteration 3 from its committed point. The batch method is deterministic up to
summation order, so the final objective must equal the run without a kill to 1e-6 relative,
and the exactly-once counters must match it: ``units`` counts each unit once per pass of the
committed iterations. Losing both copies of a slice ends the job with a clear error.
"""
import json

import pytest

from mpi_run import hpcreduce_cli

TRAIN = ("train", "-n", "5", "--mode", "sandblaster", "--servers", "2", "--steps", "6", "--batch", "1024",
         "--seed", "3", "--ft")
TIMEOUT = 90


def train(tmp_path, name, *args, env=None):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, *args, "--json", str(out), timeout=TIMEOUT, env=env)
    return result, (json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result, data = train(tmp_path_factory.mktemp("reference"), "reference")
    assert result.returncode == 0, result.output
    assert data["recovery"] == []
    return data


@pytest.mark.parametrize("victim, role", [(4, "worker"), (1, "server"), (2, "coordinator")])
def test_a_killed_rank_is_survived_with_the_same_objective(tmp_path, reference, victim, role):
    log = tmp_path / "kills.log"
    result, data = train(tmp_path, role, "--kill", f"{victim}@3", env={"HPCREDUCE_KILL_LOG": str(log)})
    assert result.returncode == 0, result.output
    assert len(log.read_text().splitlines()) == 1, "the kill did not happen"
    events = data["recovery"]
    assert [(e["kind"], e["lost"], e["step"], e["ranks_after"]) for e in events] == [("failure", [victim], 3, 4)]
    got, want = data["sandblaster"], reference["sandblaster"]
    assert got["objective"] == pytest.approx(want["objective"], rel=1e-6)
    assert data["final"]["loss"] == pytest.approx(reference["final"]["loss"], rel=1e-6)
    for key in ("units", "evaluations", "iterations", "stopped_by"):
        assert got[key] == want[key], key
    assert [row["step"] for row in data["steps"]] == [row["step"] for row in reference["steps"]]
    assert "recovery: failure at step 3: lost rank(s) [%d]" % victim in result.output


def test_a_slice_without_any_copy_left_ends_the_job_with_a_clear_error(tmp_path):
    result, _ = train(tmp_path, "both", "--kill", "0@3", "--kill", "1@3")
    assert result.returncode != 0
    assert "slice 0 (elements 0..131072) lost its server and its replica: nothing left to recover from" \
        in result.output, result.output


@pytest.mark.parametrize("flags, said", [
    (["--ft", "--kill", "0@2"], "--kill: rank 0 is the only server of --mode sandblaster with --servers 1"),
    (["--servers", "2", "--kill", "4@2"], "--kill and --kill-random need in-job fault tolerance"),
    (["--ft", "--grow", "1@2"], "--mode sandblaster recovers from failures in-job only (--ft): leave out --grow"),
])
def test_failures_it_cannot_recover_from_are_refused_by_flag(flags, said):
    result = hpcreduce_cli("train", "-n", "5", "--mode", "sandblaster", "--steps", "6", *flags, timeout=60)
    assert result.returncode == 2, result.output
    assert said in result.output, result.output
