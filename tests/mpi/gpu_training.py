"""Training on the GPU under real mpirun, ranks sharing the GPU(s) (needs cupy and a GPU).

1. BSP on the GPU gives the CPU's parameters to ``TOLERANCE`` (float32, other summation
   order): ring and PS, logreg (sparse) and MLP, the whole-parameter difference at most
   ``TOLERANCE`` times the largest parameter.
2. The state broadcast of device arrays (``collectives.broadcast``) on this launch's path
   (staged where HPCREDUCE_CUDA_AWARE=0, direct where MPI is CUDA-aware), from every root.
3. A checkpoint of device arrays, restored into device arrays through ``copy_into``.
4. ``ps.Worker.push`` takes a cupy gradient (copied to the host first).

GPU_TEST_PATH=staged|direct as in gpu_allreduce.py (direct prints "skip:" where MPI is not
CUDA-aware).
"""
import os
import shutil
import sys
import tempfile

import cupy
import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.arrays import copy_into
from hpcreduce.collectives.broadcast import broadcast_arrays
from hpcreduce.collectives.transfer import transfer_kind
from hpcreduce.ft import checkpoint_files as checkpoint
from hpcreduce.train import TOPOLOGIES, TrainConfig, train
from hpcreduce.train.models import build
from mpi_checks import run_checks

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
context = hpcreduce.init()
path = transfer_kind(True, context.cuda_aware)
if os.environ.get("GPU_TEST_PATH", "staged") == "direct" and path != "device":
    if rank == 0:
        print("skip: this MPI is not CUDA-aware (its MPIX query says no), so there is no direct path")
    sys.exit(0)
TOLERANCE = 1e-4
RUNS = [("ring", "mlp", {"steps": 20, "batch": 64, "lr": 0.1, "optimizer": "momentum"}),
        ("ring", "logreg", {"steps": 10, "batch": 1024, "lr": 0.2, "optimizer": "sgd"})]
if size >= 2:
    RUNS += [("ps", "mlp", {"steps": 10, "batch": 64, "lr": 0.1, "optimizer": "momentum"}),
             ("ps", "logreg", {"steps": 6, "batch": 1024, "lr": 0.2, "optimizer": "sgd"})]


def check_gpu_training_matches_cpu():
    for mode, name, settings in RUNS:
        results = {}
        for device in ("cpu", "gpu"):
            model, dataset = build(name, 0)
            results[device] = train(model, dataset, TrainConfig(model=name, device=device, topology=TOPOLOGIES[mode](), **settings),
                                    comm=context, verbose=False)
        cpu, gpu = results["cpu"].params, results["gpu"].params
        assert all(isinstance(value, np.ndarray) for value in gpu.values()), "result.params not on the host"
        largest = max(float(np.abs(value).max()) for value in cpu.values())
        worst = max(float(np.abs(gpu[key] - cpu[key]).max()) for key in cpu)
        if rank == 0:
            print(f"{mode} {name}: largest |cpu - gpu| {worst:.3g}, largest |parameter| {largest:.3g}", flush=True)
        assert worst <= TOLERANCE * max(largest, 1.0), (mode, name, worst, largest)


def check_state_broadcast_on_device():
    if rank == 0:
        print(f"path={path} ranks={size}", flush=True)
    for root in range(size):
        arrays = [cupy.full((33, 5), rank, cupy.float32), cupy.arange(9, dtype=cupy.int64) * (rank + 1),
                  cupy.full(0, rank, cupy.float64)]
        broadcast_arrays(context, arrays, root=root)
        assert bool((arrays[0] == root).all()) and bool((arrays[1] == cupy.arange(9) * (root + 1)).all())
        assert all(isinstance(a, cupy.ndarray) for a in arrays)


def check_checkpoint_of_device_arrays():
    folder = world.bcast(tempfile.mkdtemp(prefix="hpcreduce-gpu-ckpt-") if rank == 0 else None)
    saved = {"w": cupy.arange(12, dtype=cupy.float32).reshape(3, 4), "w/velocity": cupy.ones(3, cupy.float64)}
    if rank == 0:
        checkpoint.save(folder, 5, saved, {"ranks": size})
    world.Barrier()
    _, stored = checkpoint.load_latest(folder)
    restored = {name: cupy.zeros_like(value) for name, value in saved.items()}
    for name, value in restored.items():
        copy_into(value, stored[name])
        assert isinstance(value, cupy.ndarray) and bool((value == saved[name]).all()), name
    world.Barrier()
    if rank == 0:
        shutil.rmtree(folder)


def check_ps_worker_pushes_a_device_gradient():
    if size < 2:
        return
    from hpcreduce import ps
    role = ps.start([ps.ParamSpec("w", (8,))], lambda: {"w": np.zeros(8, np.float32)}, servers=1,
                    optimizer="sgd", lr=1.0, comm=context)
    if isinstance(role, ps.Server):
        role.serve()
        return
    role.push("w", cupy.full(8, 1.0, cupy.float32))
    role.clock()
    pulled = role.pull("w")
    role.release()
    assert isinstance(pulled, np.ndarray) and np.allclose(pulled, -(size - 1)), pulled  # SGD, lr 1, BSP


run_checks(check_gpu_training_matches_cpu, check_state_broadcast_on_device, check_checkpoint_of_device_arrays,
           check_ps_worker_pushes_a_device_gradient)
sys.exit(0)
