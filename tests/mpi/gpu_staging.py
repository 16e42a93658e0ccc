"""The device plumbing of training, checked without a GPU under real mpirun (any N >= 1):
the state broadcast (``collectives.broadcast``), checkpoints restored through
``arrays.copy_into``, the cpu ``Device`` (no copies: the cpu path computes as before),
and a clear ``GpuUnavailableError`` on every rank where ``device="gpu"`` has no GPU.
"""
import shutil
import sys
import tempfile
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from hpcreduce.arrays import Device, copy_into, cupy_available
from hpcreduce.collectives.broadcast import broadcast_arrays
from hpcreduce.errors import GpuUnavailableError
from hpcreduce.ft import checkpoint_files as checkpoint
from hpcreduce.ps.optimizers import make_optimizer
from hpcreduce.runtime.context import init
from hpcreduce.runtime.devices import gpu_problem, open_device
from hpcreduce.train import TOPOLOGIES, TrainConfig, train
from hpcreduce.train.models import build
from hpcreduce.train.ring.ring_state import TrainState
from mpi_checks import run_checks

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
ctx = init()


def state_of(seed):
    model, _ = build("mlp", 0)
    state = TrainState.initial(model, make_optimizer("adam", 0.1), seed)
    for _name, array in state.arrays():
        array[...] = np.random.default_rng([seed, array.size]).standard_normal(array.shape)
    return state


def arrays_of(value):
    return [np.full((5, 3), value, np.float32), np.arange(7, dtype=np.int64) * (value + 1),
            np.full(0, value, np.float64), np.full((2, 2), value, np.float16)]


def check_broadcast_arrays():
    """Every dtype and shape (empty ones too) from every root, on both paths' contexts
    (host arrays take the host path whatever MPI is)."""
    for cuda_aware in (False, True):
        context = SimpleNamespace(comm=world, cuda_aware=cuda_aware)
        for root in range(size):
            arrays = arrays_of(rank)
            broadcast_arrays(context, arrays, root=root)
            wrong = [str(got.dtype) for got, want in zip(arrays, arrays_of(root)) if not np.array_equal(got, want)]
            assert not wrong, f"root {root}, cuda_aware {cuda_aware}: wrong {wrong}"


def check_state_sync_and_checkpoint_restore():
    """Rank 0's state reaches every rank; a checkpoint written by rank 0 restores, through
    copy_into, into any rank's state (whatever it held) exactly."""
    state = state_of(seed=rank)
    broadcast_arrays(ctx, [array for _name, array in state.arrays()])
    want = state_of(seed=0)
    for (name, got), (_, expected) in zip(state.arrays(), want.arrays()):
        assert np.array_equal(got, expected), name
    folder = world.bcast(tempfile.mkdtemp(prefix="hpcreduce-gpu-staging-") if rank == 0 else None)
    if rank == 0:
        checkpoint.save(folder, 3, dict(want.arrays()), {"ranks": size})
    world.Barrier()
    mine = state_of(seed=rank + 7)
    metadata, stored = checkpoint.load_latest(folder)
    for name, array in mine.arrays():
        copy_into(array, stored[name])
        assert np.array_equal(array, dict(want.arrays())[name]), name
    assert metadata["step"] == 3
    world.Barrier()
    if rank == 0:
        shutil.rmtree(folder)


def check_cpu_device_makes_no_copies():
    cpu = Device("cpu")
    x = np.arange(4.0)
    assert cpu.put(x) is x and cpu.xp is np and not cpu.on_gpu
    assert open_device("cpu", None).kind == "cpu"
    model, _ = build("mlp", 0)
    initial = model.init_params(5)
    state = TrainState.initial(model, make_optimizer("momentum", 0.1), 5, cpu)
    assert all(np.array_equal(state.params[name], initial[name]) for name in initial)
    try:
        Device("tpu")
    except ValueError as err:
        assert "tpu" in str(err)
    else:
        raise AssertionError("Device('tpu') was accepted")


def check_gpu_refused_on_every_rank():
    """Without cupy or a GPU: the agreed problem names what is missing, and train() raises
    GpuUnavailableError on every rank before any step."""
    if cupy_available():
        print(f"rank {rank}: skip: this machine has a GPU", flush=True)
        return
    problem = gpu_problem(world)
    assert problem is not None and f"{size} of {size} rank(s) have none" in problem.render(), problem
    assert "cupy" in problem.render(), problem
    model, dataset = build("mlp", 0)
    for mode in ("ring", "ps"):
        if mode == "ps" and size < 2:
            continue
        try:
            train(model, dataset, TrainConfig(model="mlp", steps=2, batch=8, device="gpu", topology=TOPOLOGIES[mode]()),
                  comm=ctx, verbose=False)
        except GpuUnavailableError as err:
            assert "device gpu needs cupy and a GPU on every rank" in str(err), err
        else:
            raise AssertionError(f"{mode}: train(device='gpu') ran without a GPU")


run_checks(check_broadcast_arrays, check_state_sync_and_checkpoint_restore, check_cpu_device_makes_no_copies,
           check_gpu_refused_on_every_rank)
sys.exit(0)
