"""Parameter server under real mpirun: protocol, exactly-once, bad input, consistency, training,
server load and the float16 wire."""
import json

import numpy as np

from mpi_run import hpcreduce_cli, mpirun


def test_worker_api_protocol_exactly_once_bad_input_and_blocked_reads():
    result = mpirun(4, "ps_protocol.py", timeout=180)
    assert result.returncode == 0, result
    assert "ps protocol: 4 ranks" in result.output and "all checks passed" in result.output, result
    assert "Traceback" not in result.output, result


def test_training_bsp_matches_ring_ssp_bound_asp_trains_failure_stops_all():
    result = mpirun(4, "ps_training.py", timeout=240)
    assert result.returncode == 0, result
    assert "ps training: all checks passed" in result.output, result


def test_bench_ps_runs_every_case_for_every_server_count():
    result = mpirun(3, "ps_bench_smoke.py", timeout=180)
    assert result.returncode == 0, result
    assert "ps bench smoke: ok" in result.output, result


def test_train_reports_server_load_and_float16_wire_trains(tmp_path):
    path = tmp_path / "run.json"
    job = hpcreduce_cli("train", "-n", "5", "--mode", "ps", "--servers", "2", "--steps", "12",
                        "--wire-dtype", "float16", "--json", str(path), "--progress", "none", timeout=240)
    assert job.returncode == 0, job
    result = json.loads(path.read_text())
    load, workers = result["ps"]["load"], result["workers"]
    assert load["server_ranks"] == result["ps"]["server_ranks"]
    requests, nbytes = np.array(load["requests_per_step"]), np.array(load["bytes_per_step"])
    assert requests.shape == nbytes.shape == (2, 12)
    # each step, every worker clocks every server and reads and writes the rows it holds
    assert (requests >= 3 * workers).all() and (nbytes > 0).all(), load
    totals = requests.sum(axis=1)
    assert load["requests_max_mean"] == round(totals.max() / totals.mean(), 4), load
    cpu = np.array(load["cpu_s_per_step"])  # each server's CPU seconds per step (it does not spin idle)
    assert cpu.shape == (2, 12) and (cpu >= 0).all() and cpu.sum() > 0, load
    assert result["config"]["wire_dtype"] == "float16" and result["final"]["accuracy"] > 0.7, result["final"]
    bad = hpcreduce_cli("train", "--mode", "ps", "-n", "3", "--wire-dtype", "float8", timeout=60)
    assert bad.returncode == 2 and bad.output.count("--wire-dtype must be one of float32, float16") == 1, bad


def test_many_tables_one_request_per_server_bit_equal_exactly_once_replicated():
    result = mpirun(4, "ps_many_tables.py", timeout=180)
    assert result.returncode == 0, result.output
    assert "all checks passed" in result.output, result.output
