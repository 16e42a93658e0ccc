"""The GPU paths, checked without a GPU: path choice, CUDA-awareness detection, staging
and the stream discipline of both transfers.

numpy stands in for device memory. ``SimulatedStream`` runs every "GPU" copy and
combine at once (so results are exact), but remembers the buffers that queued work
reads or writes until the transfer waits for the stream: a buffer handed to MPI while
still remembered is the race a real GPU would have (MPI reading memory a kernel is
still writing, or overwriting a host buffer an asynchronous copy still reads), and
is recorded as a violation. A transfer that never waits must be caught.

Run under mpirun with HPCREDUCE_CUDA_AWARE=1 at N >= 2; rank 0 overrides it with
``init(cuda_aware=False)``.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.collectives.workspace import Workspace, host_allocator
from hpcreduce.collectives.native import native_allreduce
from hpcreduce.collectives.ops import OPS
from hpcreduce.collectives.recursive_doubling import recursive_doubling_allreduce
from hpcreduce.collectives.ring import ring_allreduce
from hpcreduce.collectives.transfer import (DirectTransfer, StagedTransfer, make_transfer,
                                            transfer_for, transfer_kind)
from hpcreduce.runtime import environment
from hpcreduce.runtime.context import resolve
from hpcreduce.runtime.devices import node_local_rank
from mpi_checks import run_checks

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
context = hpcreduce.init(cuda_aware=False) if rank == 0 else hpcreduce.init()


class SimulatedStream:
    """A stand-in GPU stream: which buffers queued work still uses, and MPI's hand-offs."""

    def __init__(self):
        self.busy = []
        self.violations = []
        self.waits = 0

    def begin(self):
        pass

    def wait(self):
        self.waits += 1
        self.busy.clear()

    def queue(self, what, *arrays):
        self.busy.extend((what, a) for a in arrays)

    def handed(self, buffer, how):
        for what, busy in self.busy:
            if np.may_share_memory(buffer, busy):
                self.violations.append(f"MPI {how} a buffer that {what} may still use")
                break
        return buffer

    def to_host(self, device, host):
        """Blocking copy: returns after everything queued before it."""
        np.copyto(host, device)
        self.wait()

    def to_device(self, host, device):
        """Asynchronous copy: ``host`` is read until the next wait."""
        np.copyto(device, host)
        self.queue("an asynchronous host-to-device copy", host, device)


class Checked:
    """Transfer mixin: every hand-off to MPI is checked against the simulated stream."""

    stream: SimulatedStream

    def start(self, x, out):
        super().start(x, out)
        self.stream.queue("the caller's kernel", x, out)

    def outgoing(self, source, a, b):
        return self.stream.handed(super().outgoing(source, a, b), "sends from")

    def incoming(self, slot, count):
        return self.stream.handed(super().incoming(slot, count), "receives into")

    def gathered(self, a, b):
        return self.stream.handed(super().gathered(a, b), "sends from or receives into")

    def combine(self, op, a, b, received):
        super().combine(op, a, b, received)
        self.stream.queue("a combine kernel", received, self.x[a:b], self.out[a:b])


class CheckedDirect(Checked, DirectTransfer):
    pass


class CheckedStaged(Checked, StagedTransfer):
    pass


class CarelessDirect(CheckedDirect):
    """The bug the checks exist for: MPI gets device buffers without a wait."""

    def _settle(self):
        pass


def checked(kind):
    stream = SimulatedStream()
    if kind == "staged":
        transfer = CheckedStaged(Workspace(host_allocator), Workspace(host_allocator),
                                 stream.to_host, stream.to_device, stream)
    else:
        transfer = {"direct": CheckedDirect, "careless": CarelessDirect}[kind](Workspace(host_allocator), stream)
    transfer.stream = stream
    return transfer


def reference(x, op):
    want = np.empty_like(x)
    world.Allreduce(x, want, op=OPS[op].mpi_op)
    return want


def sample(n, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-4, 4, n) if np.dtype(dtype).kind == "f" else rng.integers(-40, 40, n)).astype(dtype)


def run_algorithms(transfer, sizes=(0, 1, size + 1, 100_003)):
    """Ring (default, small and tiny segments), recursive doubling and native, out of place
    and in place, against MPI's own result; returns the mismatches."""
    algorithms = [("ring", lambda *a: ring_allreduce(*a)),
                  ("ring/4KiB", lambda *a: ring_allreduce(*a, segment_bytes=4096)),
                  ("ring/12B", lambda *a: ring_allreduce(*a, segment_bytes=12)),
                  ("recursive_doubling", recursive_doubling_allreduce),
                  ("native", native_allreduce)]
    wrong = []
    for n in sizes:
        for dtype, op in ((np.float32, "sum"), (np.float64, "max"), (np.int64, "sum")):
            x = sample(n, dtype, seed=rank * 7919 + n)
            want = reference(x, op)
            for name, algorithm in algorithms:
                if name == "ring/12B" and n > 1000:
                    continue
                out = np.zeros_like(x)
                algorithm(context.comm, x, out, OPS[op], transfer)
                in_place = x.copy()
                algorithm(context.comm, in_place, in_place, OPS[op], transfer)
                for label, got in (("out", out), ("in place", in_place)):
                    if not np.allclose(got, want, rtol=1e-6, atol=1e-5):
                        wrong.append(f"{name} {label} {np.dtype(dtype).name} {op} n={n}")
    return wrong


def check_detection_through_libmpi():
    """The library's own answer (printed: the test expects False on a machine without a GPU),
    and the variable's values."""
    library = environment._mpi_library()
    assert library is not None, "no libmpi found among this process's mapped libraries"
    detected = environment.cuda_aware(MPI, {})
    assert environment.cuda_aware(MPI, {"HPCREDUCE_CUDA_AWARE": "auto"}) is detected
    if hasattr(library, "MPIX_Query_cuda_support"):
        assert detected is bool(library.MPIX_Query_cuda_support()), detected
    if rank == 0:
        print(f"detected cuda_aware={detected} from {library._name}", flush=True)
    for value in ("1", "true", " ON ", "yes"):
        assert environment.cuda_aware(MPI, {"HPCREDUCE_CUDA_AWARE": value}) is True, value
    for value in ("0", "false", "off", "No"):
        assert environment.cuda_aware(MPI, {"HPCREDUCE_CUDA_AWARE": value}) is False, value
    try:
        environment.cuda_aware(MPI, {"HPCREDUCE_CUDA_AWARE": "maybe"})
    except ValueError as err:
        assert "HPCREDUCE_CUDA_AWARE='maybe'" in str(err) and "auto" in str(err), err
    else:
        raise AssertionError("HPCREDUCE_CUDA_AWARE=maybe was accepted")


def check_path_choice():
    assert os.environ.get("HPCREDUCE_CUDA_AWARE") == "1", "run this with HPCREDUCE_CUDA_AWARE=1"
    forced = rank != 0  # the environment forces it on; init(cuda_aware=False) wins on rank 0
    assert context.cuda_aware is forced, context
    user = world.Split(0, size - rank)
    assert resolve(user).cuda_aware is forced  # a user communicator's context inherits it
    user.Free()
    assert transfer_kind(False, True) == transfer_kind(False, False) == "host"
    assert transfer_kind(True, True) == "device" and transfer_kind(True, False) == "staged"
    assert transfer_kind(True, context.cuda_aware) == ("device" if forced else "staged")
    assert type(make_transfer({}, "device")) is DirectTransfer
    assert type(make_transfer({}, "staged")) is StagedTransfer
    assert type(make_transfer({}, "host")) is DirectTransfer
    try:
        make_transfer({}, "nvlink")
    except ValueError as err:
        assert "nvlink" in str(err)
    else:
        raise AssertionError("an unknown transfer kind was accepted")
    host = transfer_for(context, np.zeros(3))
    assert host is transfer_for(context, np.zeros(5, np.int32)) and type(host) is DirectTransfer


def check_stream_discipline_and_mixed_paths():
    """Each rank staged or direct by parity (then swapped): the same bytes on the wire,
    exact results, and no buffer handed to MPI while queued work may still use it."""
    for parity in (0, 1):
        transfer = checked("staged" if rank % 2 == parity else "direct")
        wrong = run_algorithms(transfer)
        assert not wrong, f"rank {rank} {type(transfer).__name__}: {wrong[:5]}"
        assert not transfer.stream.violations, transfer.stream.violations[:3]
        assert transfer.stream.waits > 0, "the transfer never waited for the stream"


def check_every_hand_off_waits():
    """The contract, beyond today's algorithms: each hand-off right after queued work (the
    caller's kernels, a combine, the last call's copies) waits first. Local, no MPI."""
    n = 8
    hand_offs = {"outgoing": lambda t: t.outgoing(t.out, 0, n),
                 "incoming": lambda t: t.incoming("contract", n),
                 "gathered": lambda t: t.gathered(0, n)}
    for kind in ("direct", "staged"):
        for name, hand_off in hand_offs.items():
            transfer = checked(kind)
            x, out = np.ones(n), np.zeros(n)
            transfer.start(x, out)
            hand_off(transfer)
            transfer.combine(OPS["sum"], 0, n, transfer.incoming("received", n))
            hand_off(transfer)
            transfer.finish()
            transfer.start(x, out)
            hand_off(transfer)
            assert not transfer.stream.violations, (kind, name, transfer.stream.violations)


def check_careless_transfer_is_caught():
    transfer = checked("careless")
    x = sample(size * 1000 + 3, np.float32, seed=rank)
    for algorithm in (ring_allreduce, recursive_doubling_allreduce):
        algorithm(context.comm, x, np.empty_like(x), OPS["sum"], transfer)
    assert transfer.stream.violations, "a transfer that never waits went unnoticed"
    assert any("the caller's kernel" in v for v in transfer.stream.violations), transfer.stream.violations[:3]


def check_fusion_and_allreduce_staged():
    """allreduce_many and allreduce (every algorithm, mean) through a staged transfer."""
    user = world.Dup()
    staged = checked("staged")
    resolve(user).cache["transfer.host"] = staged  # numpy arrays take the staged path here
    rng = np.random.default_rng(rank)
    arrays = [rng.standard_normal((3, 5)).astype(np.float32), np.arange(7, dtype=np.int64) * rank,
              np.zeros(0, np.float32), rng.standard_normal(30_001).astype(np.float32),
              rng.standard_normal((40, 40))[:, ::3], rng.standard_normal(11).astype(np.float16)]
    expected = [reference(np.ascontiguousarray(a), "sum") for a in arrays]
    for threshold in (64, 4096, 1 << 20):
        results = hpcreduce.allreduce_many(arrays, "sum", comm=user, threshold_bytes=threshold)
        for got, want, a in zip(results, expected, arrays):
            assert got.shape == a.shape and got.dtype == a.dtype, (threshold, got.shape, a.shape)
            # another summation order than native's (one_shot, ring): rounding, also near 0
            assert np.allclose(got, want, rtol=1e-2 if a.dtype == np.float16 else 1e-5, atol=1e-5), (threshold, a.dtype)
    copies = [a.copy() for a in arrays]
    hpcreduce.allreduce_many(copies, "sum", comm=user, inplace=True, threshold_bytes=4096)
    for got, want in zip(copies, expected):
        assert np.allclose(got, want, rtol=1e-2), got.dtype
    x = sample(50_001, np.float64, seed=rank)
    mean = reference(x, "sum") / size
    for algorithm in ("ring", "recursive_doubling", "native", "auto"):
        assert np.allclose(hpcreduce.allreduce(x, "mean", algorithm=algorithm, comm=user), mean), algorithm
    waits_before = staged.stream.waits
    hpcreduce.allreduce(x, comm=user, algorithm="ring")
    assert staged.stream.waits > waits_before, "the staged transfer was not used"
    assert not staged.stream.violations, staged.stream.violations[:3]
    user.Free()


def check_local_rank():
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    launcher_given = node.allgather(node_local_rank())  # from the launcher's variable
    assert sorted(launcher_given) == list(range(node.Get_size())), launcher_given
    assert node_local_rank(env={}) == node.Get_rank()  # from MPI's shared-memory split
    node.Free()


run_checks(check_detection_through_libmpi, check_path_choice, check_every_hand_off_waits,
           check_stream_discipline_and_mixed_paths, check_careless_transfer_is_caught,
           check_fusion_and_allreduce_staged, check_local_rank)
sys.exit(0)
