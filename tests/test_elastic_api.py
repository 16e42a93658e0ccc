"""hpcreduce.elastic, the API for users' own loops: State and run under real mpirun with
ULFM, real SIGKILLs and real growth (examples/elastic_regression.py, as a user runs it)."""
import json
import sys
from pathlib import Path

import pytest

from mpi_run import hpcreduce_cli, mpirun

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "elastic_regression.py")
TIMEOUT = 180


def test_state_commit_restore_sync_and_a_torch_loop_through_a_kill():
    pytest.importorskip("torch")
    result = mpirun(3, "elastic_state.py", ft=True, timeout=TIMEOUT)
    assert result.returncode == 0, result
    for check in ("commit_restore_sync", "torch_values", "refusals"):
        assert result.output.count(f"ok check_{check}") == 3, result
    assert result.output.count("ok check_torch_loop_survives_a_kill") == 2, result  # the two survivors


def run_example(tmp_path, name, ranks, *args):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli("launch", "-n", str(ranks), "--ft", "--", sys.executable, EXAMPLE, "--steps", "30",
                           "--out", str(out), *args, timeout=TIMEOUT, cwd=str(tmp_path))
    return result, (json.loads(out.read_text()) if out.exists() else None)


def test_the_example_grows_loses_a_newcomer_grows_again_and_computes_what_a_quiet_run_does(tmp_path):
    quiet, reference = run_example(tmp_path, "quiet", 2)
    assert quiet.returncode == 0, quiet
    wanted = tmp_path / "ranks.txt"
    wanted.write_text("4\n")
    result, data = run_example(tmp_path, "eventful", 3, "--discover", str(wanted), "--kill-at", "10")
    assert result.returncode == 0, result
    kinds = [(event["kind"], event.get("lost"), event.get("joined")) for event in data["events"]]
    assert kinds == [("growth", None, [3]), ("failure", [3], None), ("growth", None, [4])], data["events"]
    assert data["ranks"] == 4 and data["steps"] == 30 and result.output.count("now 4 ranks, from step 11") == 4
    assert data["weights"] == pytest.approx(reference["weights"], rel=1e-9, abs=1e-12)


def test_the_example_without_ulfm_stops_on_every_rank_saying_why(tmp_path):
    result = hpcreduce_cli("launch", "-n", "2", "--", sys.executable, EXAMPLE, timeout=TIMEOUT, cwd=str(tmp_path))
    assert result.returncode != 0, result
    assert result.output.count("FaultToleranceUnavailableError: fault tolerance was asked for, but ULFM is not "
                               "enabled in this launch: launch with hpcreduce launch --ft") == 2, result


def test_a_discovery_file_rank_0_cannot_use_is_a_warning_never_an_end_or_a_hang(tmp_path):
    result = mpirun(2, "elastic_bad_discovery.py", str(tmp_path / "ranks"), ft=True, timeout=TIMEOUT)
    assert result.returncode == 0 and result.output.splitlines().count("ok") == 2, result
    warned = [line for line in result.output.splitlines() if line.startswith("warned: ")]
    assert len(warned) == 6 and all("the job goes on unchanged" in line for line in warned), result
    assert "Traceback" not in result.output, result
