"""hpcreduce on cupy arrays under real mpirun, several ranks sharing the GPU(s).

Skipped without cupy and a GPU; ``bench/gpu_check.sh`` runs these on a GPU machine.
"""
import json

import pytest

from hpcreduce.arrays import cupy_available
from mpi_run import hpcreduce_cli, mpirun

pytestmark = pytest.mark.skipif(not cupy_available(),
                                reason="needs cupy and a visible GPU (see docs/gpu.md, bench/gpu_check.sh)")

PATHS = {"staged": {"HPCREDUCE_CUDA_AWARE": "0"}, "direct": {"HPCREDUCE_CUDA_AWARE": "auto"}}


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_allreduce_and_fusion_on_device_arrays(ranks, path):
    result = mpirun(ranks, "gpu_allreduce.py", env={**PATHS[path], "GPU_TEST_PATH": path}, timeout=300)
    assert result.returncode == 0, result
    skipped = [line for line in result.output.splitlines() if line.startswith("skip:")]
    if skipped:
        pytest.skip(skipped[0])
    assert f"path={'staged' if path == 'staged' else 'device'} ranks={ranks}" in result.output, result
    assert result.output.count("ok check_") == 4, result


def test_bench_allreduce_on_gpu_measures_and_agrees(tmp_path):
    report = tmp_path / "bench.json"
    result = hpcreduce_cli("bench", "allreduce", "--device", "gpu", "-n", "2", "--sizes", "4K,1M",
                           "--fusion-arrays", "10", "--json", str(report), timeout=300)
    assert result.returncode == 0, result
    measured = json.loads(report.read_text())
    assert measured["device"] == "gpu" and measured["ranks"] == 2
    names = {row["algorithm"] for row in measured["rows"]}
    assert {"ring", "auto", "native"} <= names and ("nccl" in names) == measured["nccl"].startswith("NCCL")
    assert all(row["agrees_with_native"] for row in measured["rows"]), measured["rows"]
    assert measured["fusion"]["agrees"], measured["fusion"]
    assert "ratios against" in result.output, result
