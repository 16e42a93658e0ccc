"""The "hpcreduce" torch.distributed backend against references computed locally (any N >= 2).

``init_process_group("hpcreduce")`` with nothing set; every rank builds every rank's input from the
rank number, so each result is checked here. Then async Work and futures, subgroups and a 2-D
DeviceMesh, a gloo group beside it, and bad input on one rank (the same error everywhere, the group
still working after). ``c10d_checks.py kill`` (under --with-ft ulfm): the last rank SIGKILLs itself
with operations queued; every survivor's pending and next Work fails naming it.
``c10d_checks.py world-size``: WORLD_SIZE set wrong on one rank: every rank refuses, naming it.
"""
import os
import signal
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import hpcreduce.torch  # noqa: F401 (registers the backend)
from hpcreduce.errors import HpcreduceError
from hpcreduce.torch.c10d import LostRankError
from mpi_checks import expect_raised

warnings.filterwarnings("ignore", category=FutureWarning)
if sys.argv[1:] == ["world-size"] and os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    os.environ["WORLD_SIZE"] = "7"
    try:
        dist.init_process_group("hpcreduce")
    except ValueError as error:
        assert "world size 7 (WORLD_SIZE)" in str(error), error
        print("refused: world size 7", flush=True)
    sys.exit(0)
if sys.argv[1:] == ["world-size"]:
    try:
        dist.init_process_group("hpcreduce")
    except ValueError as error:
        assert "rank 1: world size 7 (WORLD_SIZE)" in str(error), error
        print("refused: world size 7", flush=True)
    sys.exit(0)

dist.init_process_group("hpcreduce")
rank, size = dist.get_rank(), dist.get_world_size()
LAST = size - 1
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def values(r, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + r)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randint(-4, 5, shape, generator=g).to(dtype) * (1 + 1j)
    return torch.randint(1 if dtype == torch.uint8 else -4, 5, shape, generator=g).to(dtype)


def everyone(shape, dtype, seed=0):
    return [values(r, shape, dtype, seed) for r in range(size)]


def check_all_reduce():
    plain = dist.ReduceOp
    for dtype in (*FLOATS, *INTS, torch.complex64, torch.bool):
        for op, fold in ((plain.SUM, "sum"), (plain.MAX, "amax"), (plain.MIN, "amin"), (plain.PRODUCT, "prod"),
                         (plain.AVG, "mean"), (plain.BAND, "band"), (plain.BOR, "bor"), (plain.BXOR, "bxor")):
            refused = (op not in (plain.SUM, plain.AVG) and dtype.is_complex) \
                or (op == plain.AVG and dtype == torch.bool) \
                or (fold.startswith("b") and (dtype.is_floating_point or dtype.is_complex))
            x = values(rank, (3, 5), dtype, 1)
            if refused:
                expect_raised((HpcreduceError, ValueError), "", lambda: dist.all_reduce(x, op=op), rank)
                continue
            inputs = torch.stack(everyone((3, 5), dtype, 1))
            want = reference(inputs, fold, dtype)
            strided = torch.zeros(5, 3, dtype=dtype).t()  # non-contiguous
            strided.copy_(x)
            dist.all_reduce(strided, op=op)
            exact = dtype not in (torch.float16, torch.bfloat16) or fold in ("amax", "amin")
            assert strided.dtype == dtype and (torch.equal(strided, want) if exact else
                                               torch.allclose(strided.double(), want.double(), rtol=1e-2)), \
                (dtype, fold, strided, want)


def check_16_bit_sums_are_rounded_once():
    """2048 + 1 + 1 ...: a float16 sum rounded at every step stays 2048; in float32, once, it does not
    (from 3 ranks on)."""
    for dtype in (torch.float16, torch.bfloat16):
        start = 2048.0 if dtype == torch.float16 else 256.0
        x = torch.full((4,), start if rank == 0 else 1.0, dtype=dtype)
        dist.all_reduce(x)
        assert torch.equal(x, torch.full((4,), start + size - 1, dtype=torch.float32).to(dtype)), (dtype, x)
        y = torch.full((size * 2,), start if rank == 0 else 1.0, dtype=dtype)
        part = torch.empty(2, dtype=dtype)
        dist.reduce_scatter_tensor(part, y)
        assert torch.equal(part, torch.full((2,), start + size - 1, dtype=torch.float32).to(dtype)), (dtype, part)


def reference(inputs, fold, dtype):
    if fold in ("band", "bor", "bxor"):
        out = inputs[0].clone()
        for x in inputs[1:]:
            out = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[fold](out, x)
        return out
    if dtype == torch.bool:
        return inputs.any(0) if fold in ("sum", "amax") else inputs.all(0)
    wide = inputs.to(torch.complex128 if dtype.is_complex else torch.float64)
    if fold == "mean":
        total = wide.sum(0)
        return (total / size if dtype.is_floating_point or dtype.is_complex else torch.floor(total / size)).to(dtype)
    return getattr(wide, fold)(0).to(dtype) if fold != "prod" else wide.prod(0).to(dtype)


def check_gathers_and_scatters():
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.complex128):
        mine, every = values(rank, (2, 3), dtype, 2), everyone((2, 3), dtype, 2)
        out = torch.empty(2 * size, 3, dtype=dtype)
        dist.all_gather_into_tensor(out, mine)
        assert torch.equal(out, torch.cat(every)), dtype
        outs = [torch.empty(2, 3, dtype=dtype) for _ in range(size)]
        dist.all_gather(outs, mine)
        assert all(torch.equal(o, e) for o, e in zip(outs, every)), dtype
        for root in range(size):
            got = values(rank, (2, 3), dtype, 2)
            dist.broadcast(got, src=root)
            assert torch.equal(got, every[root])
            gathered = [torch.empty(2, 3, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(mine, gathered, dst=root)
            assert rank != root or all(torch.equal(g, e) for g, e in zip(gathered, every))
            part = torch.empty(2, 3, dtype=dtype)
            dist.scatter(part, [values(j, (2, 3), dtype, 9) for j in range(size)] if rank == root else None, src=root)
            assert torch.equal(part, values(rank, (2, 3), dtype, 9))
    empty = torch.empty(0)
    dist.all_reduce(empty)
    dist.all_gather_into_tensor(torch.empty(0), empty)


def check_reduce_scatter_and_reduce():
    for dtype in (torch.float32, torch.float64, torch.int64, torch.float16, torch.bfloat16):
        every = everyone((size * 4,), dtype, 3)
        out = torch.empty(4, dtype=dtype)
        dist.reduce_scatter_tensor(out, every[rank])
        want = torch.stack(every).double().sum(0)[rank * 4:(rank + 1) * 4]
        assert torch.allclose(out.double(), want, rtol=1e-2), (dtype, out, want)
        lists = [x.view(size, 4)[j].clone() for x in [every[rank]] for j in range(size)]
        out2 = torch.empty(4, dtype=dtype)
        dist.reduce_scatter(out2, lists, op=dist.ReduceOp.MAX)
        assert torch.equal(out2, torch.stack(every).max(0).values[rank * 4:(rank + 1) * 4]), dtype
    premul = dist.ReduceOp.PREMUL_SUM(0.5)  # as FSDP2 divides gradients
    every = everyone((size * 4,), torch.float32, 5)
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, every[rank].clone(), op=premul)
    assert torch.allclose(out, torch.stack(every).sum(0)[rank * 4:(rank + 1) * 4] * 0.5)
    whole = every[rank].clone()
    dist.all_reduce(whole, op=premul)
    assert torch.allclose(whole, torch.stack(every).sum(0) * 0.5)
    for root in range(size):
        x = values(rank, (4,), torch.float64, 4)
        dist.reduce(x, dst=root)
        mine = values(rank, (4,), torch.float64, 4)
        want = torch.stack(everyone((4,), torch.float64, 4)).sum(0) if rank == root else mine
        assert torch.equal(x, want)


def check_all_to_all():
    # lists of different sizes (rank r sends r + j + 1 values to rank j)
    ins = [torch.full((rank + j + 1,), float(rank * 10 + j)) for j in range(size)]
    outs = [torch.empty(j + rank + 1) for j in range(size)]
    dist.all_to_all(outs, ins)
    assert all(torch.equal(outs[j], torch.full((j + rank + 1,), float(j * 10 + rank))) for j in range(size))
    # split sizes: rank r sends j + 1 rows of 2 to rank j
    x = torch.cat([torch.full((j + 1, 2), float(rank * 10 + j)) for j in range(size)])
    out = torch.empty(size * (rank + 1), 2)
    dist.all_to_all_single(out, x, [rank + 1] * size, [j + 1 for j in range(size)])
    assert torch.equal(out, torch.cat([torch.full((rank + 1, 2), float(j * 10 + rank)) for j in range(size)]))
    even = torch.arange(size * 3, dtype=torch.int32) + 100 * rank
    got = torch.empty_like(even)
    dist.all_to_all_single(got, even)
    assert torch.equal(got, torch.cat([torch.arange(rank * 3, rank * 3 + 3, dtype=torch.int32) + 100 * j
                                       for j in range(size)]))


def check_point_to_point_and_objects():
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(1000)
    ops = [dist.P2POp(dist.isend, torch.full((1000,), float(rank)), right),
           dist.P2POp(dist.irecv, got, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(got, torch.full((1000,), float(left)))
    if rank == 0:
        dist.send(torch.arange(4.0), dst=LAST)
        dist.send(torch.arange(2.0), dst=LAST)
    elif rank == LAST:
        into = torch.empty(4)
        dist.recv(into, src=0)
        assert torch.equal(into, torch.arange(4.0))
        anyone = torch.empty(2)
        assert dist.recv(anyone) == 0 and torch.equal(anyone, torch.arange(2.0))  # recv_anysource
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
    assert objects == [{"rank": r, "text": "x" * r} for r in range(size)]
    dist.group.WORLD.monitored_barrier(timedelta(seconds=30))
    if rank != LAST:  # the last rank does not come
        expect_raised(RuntimeError, f"rank {LAST} did not reach the barrier" if rank == 0 else "timed out",
                      lambda: dist.group.WORLD.monitored_barrier(timedelta(seconds=1 if rank == 0 else 30)), rank)
    dist.barrier()
    listed = [{"from": rank}] if rank == 0 else [None]
    dist.broadcast_object_list(listed, src=0)
    assert listed == [{"from": 0}]
    dist.barrier()


def check_async_work_and_futures():
    """On the world group (inline on this machine's ranks) and on a group whose operations run on a
    communication thread, as where ranks have spare cores."""
    threaded = dist.new_group(list(range(size)))
    threaded.progress.threaded = True
    for group in (dist.group.WORLD, threaded):
        ordered_works(group)
    dist.destroy_process_group(threaded)


def ordered_works(group):
    tensors = [torch.full((1000,), float(rank + i)) for i in range(6)]
    works = [dist.all_reduce(t, async_op=True, group=group) for t in tensors]
    futures = [w.get_future().then(lambda f: f.value()[0] * 2) for w in works]
    for i, (work, future) in enumerate(zip(works, futures)):
        work.wait()
        assert work.is_completed() and work.exception() is None
        total = sum(r + i for r in range(size))
        assert torch.equal(tensors[i], torch.full((1000,), float(total)))
        assert torch.equal(future.wait(), torch.full((1000,), 2.0 * total))


def check_groups_and_device_mesh():
    members = list(range(0, size, 2))
    group = dist.new_group(members)
    if rank in members:
        x = torch.ones(3)
        dist.all_reduce(x, group=group)
        assert torch.equal(x, torch.full((3,), float(len(members))))
    from mpi4py import MPI
    from hpcreduce.torch.c10d import ProcessGroupHpcreduce
    manual = ProcessGroupHpcreduce.over(MPI.COMM_WORLD.Dup(), "over a given communicator")
    w = torch.ones(2)
    manual.allreduce([w], dist.AllreduceOptions()).wait()
    assert torch.equal(w, torch.full((2,), float(size))) and manual.size() == size and manual.rank() == rank
    gloo = dist.new_group(backend="gloo")
    y = torch.ones(2)
    dist.all_reduce(y, group=gloo)
    assert torch.equal(y, torch.full((2,), float(size)))
    if size % 2 == 0:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("replicate", "shard"))
        for dim in ("replicate", "shard"):
            sub = mesh.get_group(dim)
            z = torch.full((2,), float(rank))
            dist.all_reduce(z, group=sub)
            peers = dist.get_process_group_ranks(sub)
            assert rank in peers and torch.equal(z, torch.full((2,), float(sum(peers)))), (dim, peers, z)


def check_torch_ddp():
    """torch's own DDP: the gradients are the mean of every rank's, as computed here for all."""
    def fresh():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model = fresh()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    ddp(values(rank, (3, 6), torch.float32, 6)).pow(2).sum().backward()
    want = []
    for r in range(size):
        local = fresh()
        local(values(r, (3, 6), torch.float32, 6)).pow(2).sum().backward()
        want.append([p.grad for p in local.parameters()])
    for i, param in enumerate(model.parameters()):
        assert torch.allclose(param.grad, sum(w[i] for w in want) / size, atol=1e-5), i


def check_bad_input_on_one_rank():
    odd = rank == LAST
    for call, fragment in (
            (lambda: dist.all_reduce(torch.zeros(4 if odd else 3)), "tensors"),
            (lambda: dist.all_reduce(torch.zeros(3, dtype=torch.float64 if odd else torch.float32)), "tensors"),
            (lambda: dist.all_gather_into_tensor(torch.empty(size * 2), torch.zeros(3 if odd else 2)), ""),
            (lambda: dist.broadcast(torch.zeros(2, 2 if odd else 3), src=0), "tensors"),
            (lambda: dist.all_to_all_single(torch.empty(size), torch.zeros(size + (1 if odd else 0))), "split"),
            (lambda: dist.all_reduce(torch.zeros(2, dtype=torch.complex64), op=dist.ReduceOp.MAX), "complex")):
        expect_raised((HpcreduceError, ValueError), fragment, call, rank)
        ok = torch.ones(2)
        dist.all_reduce(ok)
        assert torch.equal(ok, torch.full((2,), float(size))), "the group still works"
    expect_raised(ValueError, "twice", lambda: dist.init_process_group("hpcreduce"), rank)
    expect_raised(ValueError, "rank", lambda: dist.new_group([0, size]), rank)
    group = dist.new_group(list(range(size)))
    work = dist.all_reduce(torch.ones(2), group=group, async_op=True)
    dist.destroy_process_group(group)
    expect_raised(RuntimeError, "after its process group was destroyed", work.wait, rank)


def run_kill():
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    if rank == LAST:
        os.kill(os.getpid(), signal.SIGKILL)
    began = time.monotonic()
    works = [dist.all_reduce(torch.ones(1 << 16), async_op=True) for _ in range(3)]
    errors = []
    for work in works + [dist.all_reduce(torch.ones(4), async_op=True)]:
        try:
            work.wait()
        except LostRankError as error:
            errors.append(str(error))
    assert len(errors) == 4 and f"rank {LAST} (world)" in errors[0], errors
    print(f"rank {rank}: every Work failed naming rank {LAST} after {time.monotonic() - began:.2f} s", flush=True)
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:] == ["kill"]:
        run_kill()
    for check in (check_all_reduce, check_16_bit_sums_are_rounded_once, check_gathers_and_scatters, check_reduce_scatter_and_reduce, check_all_to_all,
                  check_point_to_point_and_objects, check_async_work_and_futures, check_groups_and_device_mesh,
                  check_torch_ddp, check_bad_input_on_one_rank):
        check()
        dist.barrier()
        if rank == 0:
            print(f"ok {check.__name__}", flush=True)
    dist.destroy_process_group()
