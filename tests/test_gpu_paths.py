"""The GPU paths without a GPU: path choice, CUDA-awareness detection through the loaded
libmpi, the staged and direct transfers' stream discipline (numpy standing in for device
memory, under real mpirun), the device-selection helper, and a clear refusal of
``bench --device gpu`` where there is no GPU."""
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
