"""Parameter server under real mpirun: protocol, exactly-once, bad input, consistency, training."""
from mpi_run import mpirun


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
