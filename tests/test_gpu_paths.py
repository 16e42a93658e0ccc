"""The GPU paths without a GPU: path choice, CUDA-awareness detection through the loaded
libmpi, the staged and direct transfers' stream discipline (numpy standing in for device
memory, under real mpirun), the device-selection helper, the training path's device
plumbing (state broadcast, checkpoint restore, the cpu device), and a clear refusal of
``bench --device gpu`` and ``train --device gpu`` where there is no GPU."""
import pytest

from hpcreduce.arrays import cupy_available
from hpcreduce.runtime.devices import LOCAL_RANK_VARIABLES, node_local_rank
from mpi_run import hpcreduce_cli, mpirun

CHECKS = 7


def test_path_choice_detection_staging_and_stream_discipline():
    result = mpirun(3, "gpu_paths.py", env={"HPCREDUCE_CUDA_AWARE": "1"}, timeout=180)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == CHECKS, result
    if not cupy_available():  # no GPU, so no CUDA-aware MPI: the libmpi query must say so
        assert "detected cuda_aware=False from " in result.output, result


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "SLURM_LOCALID": "5"}, 2),
    ({"SLURM_LOCALID": "5", "MPI_LOCALRANKID": "1"}, 1),
    ({"SLURM_LOCALID": "5"}, 5),
    ({"PALS_LOCAL_RANKID": "3", "OMPI_COMM_WORLD_LOCAL_RANK": " "}, 3),
])
def test_local_rank_comes_from_the_launchers_variables(env, expected):
    assert node_local_rank(env) == expected
    assert set(env) <= set(LOCAL_RANK_VARIABLES)


@pytest.mark.skipif(cupy_available(), reason="this machine has a GPU")
def test_bench_on_gpu_without_one_fails_clearly_on_every_rank():
    result = hpcreduce_cli("bench", "allreduce", "--device", "gpu", "-n", "2", "--sizes", "4K", timeout=120)
    assert result.returncode != 0, result
    assert result.output.count("--device gpu needs cupy and a GPU on every rank") == 2, result
    assert "Traceback" not in result.output, result


STAGING_CHECKS = 4


@pytest.mark.parametrize("ranks", [1, 3])
def test_state_broadcast_checkpoint_restore_and_gpu_refusal_in_the_api(ranks):
    result = mpirun(ranks, "gpu_staging.py", timeout=180)
    assert result.returncode == 0, result
    assert result.output.count("ok check_") == STAGING_CHECKS, result


@pytest.mark.skipif(cupy_available(), reason="this machine has a GPU")
def test_train_on_gpu_without_one_is_refused_on_every_rank_naming_what_is_missing():
    result = hpcreduce_cli("train", "--device", "gpu", "-n", "2", "--steps", "2", timeout=120)
    assert result.returncode == 2, result
    said = [line for line in result.output.splitlines() if line.startswith("hpcreduce train:")]
    assert len(said) == 1, result  # printed once (rank 0), every rank exits 2
    assert "--device gpu needs cupy and a GPU on every rank; 2 of 2 rank(s) have none" in said[0], result
    assert "cupy library is not installed" in said[0] and "Traceback" not in result.output, result


def test_a_device_that_does_not_exist_or_does_not_fit_the_mode_is_a_flag_error():
    wrong = hpcreduce_cli("train", "--device", "tpu", "-n", "2", timeout=60)
    assert wrong.returncode == 2 and "--device must be one of cpu, gpu, got 'tpu'" in wrong.output, wrong
    batch = hpcreduce_cli("train", "--device", "gpu", "--mode", "sandblaster", "-n", "3", timeout=60)
    assert batch.returncode == 2 and "--device gpu applies to --mode ring and ps" in batch.output, batch
