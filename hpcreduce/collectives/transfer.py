"""How a collective's buffers reach MPI: directly, or staged through host memory.

A collective works on flat ``x`` (input) and ``out`` (result) arrays by index ranges
and asks its transfer for the buffer to send from, to receive into, and to combine.

- ``DirectTransfer``: MPI reads and writes the arrays themselves (numpy arrays, or
  cupy arrays where MPI is CUDA-aware).
- ``StagedTransfer``: device arrays with an MPI that cannot read device memory. Every
  message goes through a pinned host mirror of ``out``; received data is copied to the
  device and combined there, so the reduction arithmetic stays on the GPU.

The rule both keep on the GPU: MPI is handed a buffer (to send from: ``outgoing``; to
receive into: ``incoming``, ``gathered``) only once no GPU work queued earlier can
still touch it. The caller's work before ``start`` and every combine or asynchronous
copy the transfer queues make it *pending*; the next hand-off waits for the stream
once, so a run of hand-offs with no GPU work between them costs one wait. Results are
left to the stream: ``finish`` queues the last copy and returns, and later work on the
same stream sees the result. Host transfers (no ``stream``) never wait.
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol

from ..arrays import array_module, is_device_array
from .workspace import CurrentStream, Workspace, workspace
from .ops import ReduceOp

Copy = Callable[[object, object], None]

TRANSFER_KINDS = ("host", "device", "staged")


class Stream(Protocol):
    """The GPU stream a transfer orders its work on (``arrays.CurrentStream`` for cupy)."""

    def begin(self) -> None:
        """A collective starts (order it after the previous one's work)."""

    def wait(self) -> None:
        """Block until all work queued so far is done."""


class DirectTransfer:
    """MPI reads and writes ``x`` and ``out`` in place."""

    def __init__(self, scratch: Workspace, stream: Optional[Stream] = None):
        self._scratch = scratch
        self._stream = stream
        self._pending = False

    def start(self, x, out) -> None:
        self.x, self.out, self.xp = x, out, array_module(out)
        if self._stream is not None:
            self._stream.begin()
        self._queued()  # the caller's kernels may still be writing x

    def outgoing(self, source, a: int, b: int):
        """Buffer to send ``source[a:b]`` from."""
        self._settle()
        return source[a:b]

    def incoming(self, slot: str, count: int):
        """Scratch buffer to receive ``count`` elements that will be combined."""
        self._settle()
        return self._scratch.get(slot, self.out.dtype, count)

    def combine(self, op: ReduceOp, a: int, b: int, received) -> None:
        """``out[a:b] = x[a:b] (op) received`` (queued on the stream for device arrays)."""
        op.combine(self.xp, self.x[a:b], received, self.out[a:b])
        self._queued()

    def gathered(self, a: int, b: int):
        """Buffer holding (or receiving) the finished result ``out[a:b]``."""
        self._settle()
        return self.out[a:b]

    def finish(self) -> None:
        """Complete ``out`` from what ``gathered`` buffers received."""

    def _queued(self) -> None:
        """GPU work was queued that may still use buffers MPI could be handed next."""
        self._pending = self._stream is not None

    def _settle(self) -> None:
        if self._pending:
            self._stream.wait()
            self._pending = False


class StagedTransfer(DirectTransfer):
    """Device arrays through host memory; combines run on the device.

    ``to_host(device, host)`` must return once the copy is done, after all work queued
    before it (cupy's blocking ``get``); ``to_device(host, device)`` may be queued
    asynchronously (cupy's ``set``): the host buffer it reads counts as in use until
    the next wait.
    """

    def __init__(self, scratch: Workspace, device_scratch: Workspace,
                 to_host: Copy, to_device: Copy, stream: Optional[Stream] = None):
        super().__init__(scratch, stream)
        self._device_scratch = device_scratch
        self._to_host = to_host
        self._to_device = to_device

    def start(self, x, out) -> None:
        super().start(x, out)
        self.mirror = self._scratch.get("stage.mirror", out.dtype, out.size)

    def outgoing(self, source, a: int, b: int):
        self._to_host(source[a:b], self.mirror[a:b])
        self._pending = False  # a blocking copy waited for everything queued before it
        return self.mirror[a:b]

    def combine(self, op: ReduceOp, a: int, b: int, received) -> None:
        on_device = self._device_scratch.get("stage.received", self.out.dtype, b - a)
        self._to_device(received, on_device)
        super().combine(op, a, b, on_device)

    def gathered(self, a: int, b: int):
        self._settle()
        return self.mirror[a:b]

    def finish(self) -> None:
        self._to_device(self.mirror, self.out)  # the next start() makes the transfer pending


def cupy_to_host(device, host) -> None:
    """Device-to-host copy on the current stream; returns when it (and all work queued
    before it) is done."""
    device.get(out=host)


def cupy_to_device(host, device) -> None:
    """Host-to-device copy queued on the current stream (asynchronous from pinned memory)."""
    device.set(host)


def transfer_kind(on_device: bool, cuda_aware: bool) -> str:
    """``host`` for numpy arrays; for cupy arrays ``device`` when MPI is CUDA-aware,
    else ``staged``."""
    if not on_device:
        return "host"
    return "device" if cuda_aware else "staged"


def make_transfer(cache: dict, kind: str) -> DirectTransfer:
    """A new transfer of ``kind`` over the context-cached workspaces in ``cache``."""
    if kind == "host":
        return DirectTransfer(workspace(cache, "host"))
    if kind == "device":
        return DirectTransfer(workspace(cache, "device"), CurrentStream())
    if kind == "staged":
        return StagedTransfer(workspace(cache, "pinned"), workspace(cache, "device"),
                              cupy_to_host, cupy_to_device, CurrentStream())
    raise ValueError(f"unknown transfer kind {kind!r} (known: {', '.join(TRANSFER_KINDS)})")


def transfer_for(context, x) -> DirectTransfer:
    """The context's transfer for ``x``: cached as ``context.cache["transfer.KIND"]``."""
    kind = transfer_kind(is_device_array(x), context.cuda_aware)
    key = f"transfer.{kind}"
    found = context.cache.get(key)
    if found is None:
        found = context.cache[key] = make_transfer(context.cache, kind)
    return found
