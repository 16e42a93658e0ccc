"""How a collective's buffers reach MPI: directly, or staged through host memory.

A collective works on flat ``x`` (input) and ``out`` (result) arrays by index ranges
and asks its transfer for the buffer to send from, to receive into, and to combine.

- ``DirectTransfer``: MPI reads and writes the arrays themselves (numpy arrays, or
  cupy arrays where MPI is CUDA-aware). GPU work is synchronised before MPI reads.
- ``StagedTransfer``: device arrays with an MPI that cannot read device memory. Every
  message goes through a pinned host mirror of ``out``; received data is copied to the
  device and combined there, so the reduction arithmetic stays on the GPU.
"""
from __future__ import annotations

from typing import Callable

from .arrays import Workspace, array_module, is_device_array, synchronize
from .ops import ReduceOp

Copy = Callable[[object, object], None]


class DirectTransfer:
    """MPI reads and writes ``x`` and ``out`` in place."""

    def __init__(self, scratch: Workspace):
        self._scratch = scratch

    def start(self, x, out) -> None:
        self.x, self.out, self.xp = x, out, array_module(out)
        self._on_device = is_device_array(out)

    def outgoing(self, source, a: int, b: int):
        """Buffer to send ``source[a:b]`` from (after GPU work on it has finished)."""
        if self._on_device:
            synchronize(source)
        return source[a:b]

    def incoming(self, slot: str, count: int):
        """Scratch buffer to receive ``count`` elements that will be combined."""
        return self._scratch.get(slot, self.out.dtype, count)

    def combine(self, op: ReduceOp, a: int, b: int, received) -> None:
        """``out[a:b] = x[a:b] (op) received``."""
        op.combine(self.xp, self.x[a:b], received, self.out[a:b])

    def gathered(self, a: int, b: int):
        """Buffer holding (or receiving) the finished result ``out[a:b]``."""
        return self.out[a:b]

    def finish(self) -> None:
        """Complete ``out`` from what ``gathered`` buffers received."""


class StagedTransfer(DirectTransfer):
    """Device arrays through host memory; combines run on the device."""

    def __init__(self, scratch: Workspace, device_scratch: Workspace,
                 to_host: Copy, to_device: Copy):
        super().__init__(scratch)
        self._device_scratch = device_scratch
        self._to_host = to_host
        self._to_device = to_device

    def start(self, x, out) -> None:
        super().start(x, out)
        self.mirror = self._scratch.get("stage.mirror", out.dtype, out.size)

    def outgoing(self, source, a: int, b: int):
        self._to_host(source[a:b], self.mirror[a:b])
        return self.mirror[a:b]

    def combine(self, op: ReduceOp, a: int, b: int, received) -> None:
        on_device = self._device_scratch.get("stage.received", self.out.dtype, b - a)
        self._to_device(received, on_device)
        op.combine(self.xp, self.x[a:b], on_device, self.out[a:b])

    def gathered(self, a: int, b: int):
        return self.mirror[a:b]

    def finish(self) -> None:
        self._to_device(self.mirror, self.out)


def cupy_to_host(device, host) -> None:
    """Blocking device-to-host copy (it also orders after earlier work on the stream)."""
    device.get(out=host)


def cupy_to_device(host, device) -> None:
    device.set(host)
