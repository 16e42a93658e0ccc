"""Bucket reductions started from autograd hooks, waited for at the end of backward.

Each parameter's post-accumulate-grad hook puts its gradient, divided by the number of
ranks, into its bucket view (a gradient autograd made anew, after ``zero_grad(set_to_none=True)``,
is copied in and divided in the same pass, as DDP does; one accumulated in place is divided
there) and counts it; once a bucket's last gradient is ready, it and any later buckets already complete are
handed to the reduction thread, in bucket order, which is the same on every rank. At the
end of backward (an autograd callback) buckets still incomplete are handed over with the
missing gradients as zeros (a parameter unused in this step), the thread is waited for,
and every rank raises the same ``TrainingError`` if a reduced bucket holds a NaN or an Inf
(``finite``): a rank whose gradient could not go into its bucket (a changed shape, a sparse
or foreign-dtype gradient) fills the view with NaN, so every rank stops at that parameter.
Inside ``no_sync`` gradients accumulate in their views and nothing is reduced; an optimizer
step over gradients accumulated so and never reduced is refused (``guard_optimizer_steps``).
The library's communicator is its own duplicate of the context's (made again after a
recovery replaced the context's), used by the reduction thread alone.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Set, Tuple

import torch
from mpi4py import MPI
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..errors import TrainingError, UnsupportedInputError
from ..ft.watchdog import watchdog
from ..runtime.context import resolve
from .buckets import Bucket
from .comm_thread import CommThread, has_spare_core
from .finite import bucket_finite, nonfinite
from .wire import BucketWire

LIVE: "weakref.WeakSet[Reducer]" = weakref.WeakSet()


class Reducer:
    """The hooks, the order of hand-over and the waiting of one wrapped module's buckets."""

    def __init__(self, buckets: List[Bucket], *, comm, compression: Optional[str], check_finite: bool,
                 overlap: Optional[bool]):
        self.buckets = buckets
        self.comm_arg = comm
        context = resolve(comm)
        self.wires = [BucketWire(bucket, compression, context.cuda_aware) for bucket in buckets]
        self.check_finite = check_finite
        self.syncing = True
        self.steps = 0
        if overlap is None:  # a GPU computes backward; on CPUs the thread needs a core of its own
            overlap = any(b.flat.device.type == "cuda" for b in buckets) or has_spare_core(torch.get_num_threads())
        self.thread = CommThread(overlap and MPI.Query_thread() == MPI.THREAD_MULTIPLE)
        self.where: Dict[int, Tuple[Bucket, int]] = {}
        self.fresh: Set[int] = set()  # parameters with a gradient since the last reduction (ids)
        self.problems: Dict[Tuple[int, int], str] = {}  # (bucket, position) -> why its view is NaN
        self._running = False
        self._next = 0
        self._scale = 1.0
        self._fired: Set[int] = set()  # parameters whose gradient came in this synchronised backward
        self._finite: List[bool] = [True] * len(buckets)
        self._comm: Optional[MPI.Intracomm] = None
        self._source: Optional[MPI.Intracomm] = None
        for bucket in buckets:
            for position, param in enumerate(bucket.params):
                self.where[id(param)] = (bucket, position)
                param.register_post_accumulate_grad_hook(self._on_gradient)
        LIVE.add(self)

    def wire_bytes(self) -> int:
        """Bytes this rank sends per synchronised step."""
        size = resolve(self.comm_arg).size
        return sum(wire.bytes_sent(size) for wire in self.wires)

    def note_problem(self, name: str, why: str) -> None:
        """A parameter this rank cannot reduce in this step: its view goes as NaN, so every rank stops."""
        for bucket in self.buckets:
            if name in bucket.names:
                self.problems[(bucket.index, bucket.names.index(name))] = why

    def _on_gradient(self, param: torch.Tensor) -> None:
        try:
            if not self._running:
                self._begin()
            bucket, position = self.where[id(param)]
            scale = self._scale if self.syncing else 1.0
            view = param.grad
            if view is None or view.data_ptr() != bucket.views[position].data_ptr():
                self._take(bucket, position, param, scale)
            elif scale != 1.0:
                view.mul_(scale)  # accumulated in place (also over no_sync backwards)
            self.fresh.add(id(param))
            if self.syncing:
                self._fired.add(id(param))
                bucket.waiting -= 1
                if bucket.waiting == 0:
                    self._hand_over_ready()
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """A backward that raised: forget its gradients, let what was handed over end."""
        self._running = False
        self.fresh.clear()
        self.problems = {}
        try:
            self.thread.wait()
        except Exception:  # the error that matters is the one being raised
            pass

    def _take(self, bucket: Bucket, position: int, param: torch.Tensor, scale: float) -> None:
        """Put a gradient autograd made anew into its view, times ``scale`` (or note why it cannot go there)."""
        grad, view = param.grad, bucket.views[position]
        if grad is None:
            return
        why = None
        if grad.is_sparse:
            why = "its gradient is sparse (use a dense layer, or the parameter server's rows)"
        elif grad.shape != view.shape:
            why = (f"its gradient has shape {tuple(grad.shape)}, its bucket {tuple(view.shape)} "
                   f"(it changed after wrapping)")
        elif grad.dtype != view.dtype or grad.device != view.device:
            why = f"its gradient is {grad.dtype} on {grad.device}, its bucket {view.dtype} on {view.device}"
        if why:
            self.problems[(bucket.index, position)] = why
            return
        if scale != 1.0:
            torch.mul(grad, scale, out=view)
        else:
            view.copy_(grad)
        param.grad = view

    def _begin(self) -> None:
        """The first gradient of a backward: count every bucket's gradients, wait at the end."""
        self._running = True
        self._next = 0
        self._scale = 1.0 / resolve(self.comm_arg).size
        self._fired.clear()
        for bucket in self.buckets:
            bucket.waiting = len(bucket.params)
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _hand_over_ready(self) -> None:
        """Hand every complete bucket from the next one on to the reduction thread, in order."""
        while self._next < len(self.buckets) and self.buckets[self._next].waiting == 0:
            self._hand_over(self.buckets[self._next])
            self._next += 1

    def _hand_over(self, bucket: Bucket) -> None:
        for (index, position) in self.problems:
            if index == bucket.index:
                bucket.views[position].fill_(float("nan"))
        comm, wire, check = self._communicator(), self.wires[bucket.index], self.check_finite or bool(self.problems)
        ready = None
        if bucket.flat.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(bucket.flat.device))

        def job() -> None:
            if ready is not None:
                ready.synchronize()
            try:
                wire.reduce(comm)
                if ready is not None:
                    torch.cuda.current_stream(bucket.flat.device).synchronize()
            except MPI.Exception:
                if resolve(self.comm_arg).ft:
                    comm.Revoke()  # peers still waiting in this bucket's reduction learn of it
                raise
            self._finite[bucket.index] = not check or bucket_finite(bucket)

        self.thread.submit(job)

    def _communicator(self) -> MPI.Intracomm:
        """The library's duplicate of the context's communicator (made again after a recovery)."""
        context = resolve(self.comm_arg)
        if self._source is not context.comm:
            self._comm = context.comm.Dup()
            self._comm.Set_errhandler(MPI.ERRORS_RETURN)
            self._source = context.comm
        return self._comm

    def _finish(self) -> None:
        """End of backward: hand over the rest (missing gradients as zeros), wait, check."""
        self._running = False
        if not self.syncing:
            return
        for bucket in self.buckets[self._next:]:
            for position, (param, view) in enumerate(zip(bucket.params, bucket.views)):
                if id(param) in self._fired or (bucket.index, position) in self.problems:
                    continue
                if id(param) in self.fresh:  # accumulated inside no_sync, not in this backward
                    view.mul_(self._scale)
                else:
                    view.zero_()
                    param.grad = view
            bucket.waiting = 0
        try:
            self._hand_over_ready()
            with watchdog.guard(f"the gradient reduction of step {self.steps}"):
                self.thread.wait()
        finally:
            problems, self.problems = self.problems, {}
            self.fresh.clear()
            self.steps += 1
        bad = [name for bucket, ok in zip(self.buckets, self._finite) if not ok for name in nonfinite(bucket)]
        if bad or problems:
            raise TrainingError(self._verdict(bad, problems))

    def _verdict(self, bad: List[str], problems: Dict[Tuple[int, int], str]) -> str:
        mine = "; ".join(f"{self.buckets[index].names[position]}: {why}" for (index, position), why in problems.items())
        return (f"DistributedDataParallel, step {self.steps - 1}: the reduced gradient of "
                f"{', '.join(bad) or 'nothing'} "
                f"holds NaN or Inf (a rank's gradient did, or could not be reduced"
                f"{': on this rank, ' + mine if mine else ''}); the optimizer must not step on it. "
                f"Under loss scaling, which expects this, pass check_finite=False")


def guard_optimizer_steps() -> None:
    """Refuse an optimizer step over gradients accumulated inside ``no_sync`` and never reduced."""
    def before_step(optimizer: torch.optim.Optimizer, _args, _kwargs) -> None:
        for reducer in list(LIVE):
            if reducer.fresh and not reducer._running:
                stepping = {id(p) for group in optimizer.param_groups for p in group["params"]}
                unsynced = stepping & reducer.fresh
                if unsynced:
                    bucket, position = reducer.where[next(iter(unsynced))]
                    name = bucket.names[position]
                    raise UnsupportedInputError(
                        f"optimizer.step() over gradients accumulated inside no_sync() and not reduced "
                        f"(parameter {name!r} among {len(unsynced)}): every rank would step on its own gradient. "
                        f"Run the last backward of the accumulation outside no_sync()")
    register_optimizer_step_pre_hook(before_step)
