"""hpcreduce on cupy arrays under real mpirun, several ranks sharing the GPU(s): allreduce,
``train --device gpu`` (ring and PS, against the CPU, checkpoints, a lost and a grown rank)
and hpcreduce.torch on CUDA tensors, on the staged and (where MPI is CUDA-aware) direct path.

Skipped without cupy and a GPU; ``bench/gpu_check.sh`` runs these on a GPU machine.
"""
import json

import pytest

from hpcreduce.arrays import cupy_available
from mpi_run import hpcreduce_cli, mpirun

pytestmark = pytest.mark.skipif(not cupy_available(),
                                reason="needs cupy and a visible GPU (see docs/gpu.md, bench/gpu_check.sh)")

PATHS = {"staged": {"HPCREDUCE_CUDA_AWARE": "0"}, "direct": {"HPCREDUCE_CUDA_AWARE": "auto"}}


def run_on_gpus(ranks: int, script: str, path: str, timeout: float):
    """``tests/mpi/<script>`` on the GPU path ``path``; skipped when the program says why it cannot run."""
    result = mpirun(ranks, script, env={**PATHS[path], "GPU_TEST_PATH": path}, timeout=timeout)
    assert result.returncode == 0, result
    skipped = [line for line in result.output.splitlines() if line.startswith("skip:")]
    if skipped:
        pytest.skip(skipped[0])
    return result


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_allreduce_and_fusion_on_device_arrays(ranks, path):
    result = run_on_gpus(ranks, "gpu_allreduce.py", path, timeout=300)
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
    pcie = measured["pcie"]  # the staged path's ceiling, from the copy bandwidth cupy measures
    assert pcie["host_to_device_GBps"] > 0 and pcie["device_to_host_GBps"] > 0, pcie
    assert pcie["staged_ceiling_busbw_GBps"] < min(pcie["host_to_device_GBps"], pcie["device_to_host_GBps"]), pcie
    if measured["ranks_per_gpu"] > 1:  # NCCL cannot run: said, not failed
        assert "nccl" not in names and measured["nccl"].startswith("not measured: "), measured["nccl"]
    assert "ratios against" in result.output, result


@pytest.mark.parametrize("path", sorted(PATHS))
def test_training_on_gpu_matches_cpu_and_device_state_moves(path):
    result = run_on_gpus(3, "gpu_training.py", path, timeout=400)
    assert f"path={'staged' if path == 'staged' else 'device'} ranks=3" in result.output, result
    assert result.output.count("ok check_") == 4, result


@pytest.mark.parametrize("path", sorted(PATHS))
def test_torch_on_cuda_tensors(path):
    pytest.importorskip("torch")
    result = run_on_gpus(3, "gpu_torch.py", path, timeout=300)
    assert "torch on CUDA" in result.output and "all checks passed" in result.output, result


@pytest.mark.parametrize("mode, ranks", [("ring", 2), ("ps", 3)])
def test_train_command_on_gpu(tmp_path, mode, ranks):
    report = tmp_path / "run.json"
    result = hpcreduce_cli("train", "--device", "gpu", "--mode", mode, "-n", str(ranks), "--model", "mlp",
                           "--steps", "60", "--json", str(report), "--quiet", timeout=300)
    assert result.returncode == 0, result
    run = json.loads(report.read_text())
    assert run["config"]["device"] == "gpu" and run["config"]["mode"] == mode
    assert run["final"]["accuracy"] > 0.5, run["final"]  # 10 classes: chance is 0.1


def test_train_on_gpu_resumes_a_checkpoint(tmp_path):
    folder = str(tmp_path / "ckpt")
    common = ("train", "--device", "gpu", "-n", "2", "--model", "mlp", "--checkpoint-dir", folder,
              "--checkpoint-every", "2", "--quiet")
    first = hpcreduce_cli(*common, "--steps", "4", timeout=300)
    assert first.returncode == 0, first
    second = hpcreduce_cli(*common, "--steps", "6", timeout=300)
    assert second.returncode == 0 and "resumed from the checkpoint of step 4" in second.output, second


def test_train_on_gpu_loses_a_rank_and_grows(tmp_path):
    report = tmp_path / "elastic.json"
    result = hpcreduce_cli("train", "--device", "gpu", "-n", "3", "--ft", "--model", "mlp", "--steps", "8",
                           "--kill", "2@3", "--grow", "1@5", "--json", str(report), "--quiet", timeout=300)
    if result.returncode == 2 and "ULFM" in result.output:
        pytest.skip("this MPI has no ULFM: " + result.output.strip().splitlines()[-1])
    assert result.returncode == 0, result
    run = json.loads(report.read_text())
    assert [e["kind"] for e in run["recovery"]] == ["failure", "growth"], run["recovery"]
    assert run["ranks"] == 3 and len(run["steps"]) == 8, run
