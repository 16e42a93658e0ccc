"""Bucket reductions started from autograd hooks, waited for at the end of backward.

The reducer decides *when* a bucket goes; its comm hook (torch's ``hook(state, bucket)``,
``hooks``; ``allreduce_hook`` by default) decides *how*. Each parameter's
post-accumulate-grad hook counts its gradient (without a reduction thread it only notes the
parameter, and the end of backward takes them all in one pass); one autograd made anew (after
``zero_grad(set_to_none=True)``) is copied into its bucket view, as DDP does, except under the
default hook on a host bucket, whose reduction reads it where it lies and writes the mean back
into it (``allreduce_pieces(in_place=True)``, the NaN/Inf verdict taken in the same copy out), so
it stays the ``.grad`` and the bucket is not touched (the loop's footprint); once a
bucket's last gradient is ready, it and any later buckets already complete are handed to the
reduction thread, in bucket order, which is the same on every rank, where the hook runs with
the library's communicator current. At the end of backward (an autograd callback) buckets
still incomplete are handed over with the missing gradients as zeros, the thread is waited
for, and the ranks learn which parameters any rank used (under the default hook a flag per
parameter reduced with the last bucket, held back for it; else one small allreduce): one used on
no rank keeps its ``.grad`` as it was (``None`` after ``zero_grad()``, as torch DDP leaves it;
a layer frozen after wrapping is left alone), one used on some ranks only gets the mean with
zeros for the others. Every rank raises the same ``TrainingError`` if a reduced bucket holds a
NaN or an Inf (``finite``): a rank whose gradient could not go into its bucket (a changed
shape, a sparse or foreign-dtype gradient) fills the view with NaN, so every rank stops at
that parameter. A hook that raises or returns the wrong thing on one rank reports it through
the collectives' cross-rank check (``agree``), which its peers meet in their hook's next
collective or in the end-of-step allreduce: every rank raises it, none waits.
Inside ``no_sync`` gradients accumulate in their views and nothing is reduced; an optimizer
step over gradients accumulated so and never reduced is refused (``StepGuard``, installed
while a reducer lives, removed with the last one).
The library's communicator is its own duplicate of the context's (made again after a
recovery replaced the context's), used by the reduction thread alone.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np
import torch
from mpi4py import MPI

from ..collectives.allreduce import allreduce_pieces
from ..collectives.validate import InputProblem, ProblemKind, agree
from ..errors import TrainingError
from ..ft.watchdog import watchdog
from ..runtime.context import Context, resolve
from ..runtime.failures import revoke
from .buckets import Bucket, unfit
from .comm_thread import CommThread, has_spare_core
from .dtypes import NARROW
from .finite import bucket_finite, nonfinite
from .hooks.agreement import agree_on_hook, hook_name, sync_hook_state
from .hooks.bucket import REPORT_FIELDS, GradBucket, all_reduce, hook_result, running_on
from .hooks.default import allreduce_hook
from .step_guard import STEP_GUARD
from .zero_grads import GradientShards

Hook = Callable[[Any, GradBucket], "torch.futures.Future[torch.Tensor]"]


class Reducer:
    """The hooks, the order of hand-over and the waiting of one wrapped module's buckets."""

    def __init__(self, buckets: List[Bucket], *, comm, check_finite: bool, overlap: Optional[bool]):
        self.buckets = buckets
        self.comm_arg = comm
        self.hook: Hook = allreduce_hook
        self.state: Any = None
        self.check_finite = check_finite
        self.syncing = True
        self.steps = 0
        self.sent_last_step = 0
        self.shards: Optional[GradientShards] = None  # ZeRO-2: set by a ZeroRedundancyOptimizer
        if overlap is None:  # a GPU computes backward; on CPUs the thread needs a core of its own
            overlap = any(b.flat.device.type == "cuda" for b in buckets) or has_spare_core(torch.get_num_threads())
        self.thread = CommThread(overlap and MPI.Query_thread() == MPI.THREAD_MULTIPLE)
        self.where: Dict[int, Tuple[Bucket, int]] = {}
        self.fresh: Set[int] = set()  # parameters with a gradient since the last reduction (ids)
        self.problems: Dict[Tuple[int, int], str] = {}  # (bucket, position) -> why its view is NaN
        self.running = False
        self._next = 0
        self._fired: Set[int] = set()  # parameters whose gradient came in this synchronised backward
        self._arrived: List[torch.Tensor] = []  # parameters whose gradient came, not yet taken (no thread)
        self._finite: List[bool] = [True] * len(buckets)
        self._context: Optional[Context] = None
        self._source: Optional[MPI.Intracomm] = None
        self._regrouped = False  # the communicator was made anew since the last step's hook check
        self._flags: Optional[np.ndarray] = None  # this step's used-parameter flags, reduced with the last bucket
        self._flags_kept: Optional[np.ndarray] = None  # the array _flags is, made once
        self._flags_scratch: Optional[np.ndarray] = None  # allreduce_pieces' scratch for the last bucket and flags
        self.new_buffers()
        me = weakref.ref(self)  # the parameters' hooks must not keep the reducer alive

        def on_gradient(param: torch.Tensor) -> None:
            reducer = me()
            if reducer is not None:
                reducer._on_gradient(param)

        handles = []
        for bucket in buckets:
            for position, param in enumerate(bucket.params):
                self.where[id(param)] = (bucket, position)
                handles.append(param.register_post_accumulate_grad_hook(on_gradient))
        self._order = {key: i for i, key in enumerate(self.where)}
        STEP_GUARD.hold(self, handles)

    def new_buffers(self) -> None:
        """The hooks' view of the buckets (``GradBucket``), made again when their buffers are."""
        self._grad_buckets = [GradBucket(b.index, b.flat, b.views, b.params, b.index == len(self.buckets) - 1)
                              for b in self.buckets]

    def note_problem(self, name: str, why: str) -> None:
        """A parameter this rank cannot reduce in this step: its view goes as NaN, so every rank stops."""
        for bucket in self.buckets:
            if name in bucket.names:
                self.problems[(bucket.index, bucket.names.index(name))] = why

    def _on_gradient(self, param: torch.Tensor) -> None:
        """A parameter's gradient is complete: on the reduction thread its bucket may go now;
        without one every bucket goes at the end of backward anyway, so the hook only notes the
        parameter and ``_finish`` takes them all in one warm pass (a hook's work between
        backward's kernels runs on cold caches: measured 15 us a parameter)."""
        try:
            if not self.running:
                self._begin()
            if self.thread.threaded:
                self._arrive(param)
            else:
                self._arrived.append(param)
        except BaseException:
            self.abandon()
            raise

    def _arrive(self, param: torch.Tensor) -> None:
        """Take ``param``'s new gradient into its bucket; hand over the buckets it completes."""
        bucket, position = self.where[id(param)]
        grad = param.grad
        if grad is None or grad.data_ptr() != bucket.views[position].data_ptr():
            if grad is not None and self.syncing and self._direct(bucket) and grad.is_contiguous() \
                    and unfit(grad, bucket.views[position]) is None:
                bucket.sources[position] = grad  # reduced where it lies, no copy into the bucket
            else:
                self._take(bucket, position, param)
        self.fresh.add(id(param))
        if self.syncing:
            self._fired.add(id(param))
            bucket.waiting -= 1
            if bucket.waiting == 0:
                self._hand_over_ready()

    def abandon(self) -> None:
        """A backward that raised (in a hook, or in autograd before its end: ``forward`` calls
        this then): forget its gradients, let what was handed over end."""
        self.running = False
        self._arrived.clear()
        self.fresh.clear()
        self.problems = {}
        try:
            self.thread.wait()
        except Exception:  # the error that matters is the one being raised
            pass

    def _carries_flags(self) -> bool:
        """Whether the last bucket's reduction also carries which parameters each rank used (the
        default hook reducing it where it lies: one collective fewer a step); the same on every
        rank, as the hook and the buckets are."""
        return self.syncing and self._direct(self.buckets[-1])

    def _direct(self, bucket: Bucket) -> bool:
        """Whether ``bucket`` is reduced from autograd's own tensors (``allreduce_pieces``): the
        default hook on a host bucket of 32 or 64 bits, no ZeRO-2; other hooks see the bucket."""
        return self.hook is allreduce_hook and self.state is None and self.shards is None \
            and bucket.flat.device.type == "cpu" and bucket.flat.dtype not in NARROW

    def _take(self, bucket: Bucket, position: int, param: torch.Tensor) -> None:
        """Put a gradient autograd made anew into its view (or note why it cannot go there)."""
        grad, view = param.grad, bucket.views[position]
        if grad is None:
            return
        why = unfit(grad, view)
        if why:
            self.problems[(bucket.index, position)] = why
            return
        view.copy_(grad)
        param.grad = view

    def _begin(self) -> None:
        """The first gradient of a backward: count every bucket's gradients, wait at the end;
        a synchronised one first agrees on the hook (``hooks.agreement``), whose state takes rank
        0's after the ranks changed."""
        if self.syncing:
            context, regrouped, self._regrouped = self.context(), self._regrouped, False
            self.thread.submit(lambda: self.agree_hook(self.hook, self.state, None, context, regrouped))
        self.running = True
        self._next = 0
        self._fired.clear()
        if self.shards is not None:
            self.shards.restore()
        for bucket in self.buckets:
            bucket.waiting = len(bucket.params)
            bucket.sources = [None] * len(bucket.params)
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _hand_over_ready(self, final: bool = False) -> None:
        """Hand every complete bucket from the next one on to the reduction thread, in order;
        the last one, when it carries the used-parameter flags (``_carries_flags``), only at the
        end of backward (``final``: its gradients, the first layers', come last anyway)."""
        held = 0 if final or not self._carries_flags() else 1
        while self._next < len(self.buckets) - held and self.buckets[self._next].waiting == 0:
            self._hand_over(self.buckets[self._next])
            self._next += 1

    def _hand_over(self, bucket: Bucket) -> None:
        for (index, position) in self.problems:
            if index == bucket.index:
                bucket.sources[position] = None
                bucket.views[position].fill_(float("nan"))
        context, check = self.context(), self.check_finite or bool(self.problems)
        shards, ready, direct = self.shards, None, self._direct(bucket)
        if bucket.flat.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(bucket.flat.device))

        def job() -> None:
            if ready is not None:
                ready.synchronize()
            try:
                if shards is not None:  # ZeRO-2: this rank's chunk, always checked (its peers' are not here)
                    self._finite[bucket.index] = shards.reduce(bucket)
                    return
                verdict = self._run_hook(context, bucket, direct, check)
                if ready is not None:
                    torch.cuda.current_stream(bucket.flat.device).synchronize()
            except MPI.Exception:
                if resolve(self.comm_arg).ft:
                    context.comm.Revoke()  # peers still waiting in this bucket's reduction learn of it
                raise
            self._finite[bucket.index] = not check or (verdict if direct else bucket_finite(bucket))

        self.thread.submit(job)

    def _run_hook(self, context: Context, bucket: Bucket, direct: bool, check: bool) -> bool:
        """The hook's reduction of ``bucket`` into its buffer (``direct``: the default hook's,
        from autograd's tensors where they lie, returning whether the result may be finite when
        ``check``); a local failure is agreed on."""
        try:
            if direct:
                pieces = [(view if source is None else source).detach().numpy().reshape(-1)
                          for source, view in zip(bucket.sources, bucket.views)]
                flags, scratch = self._flags, bucket.flat.numpy()
                if flags is not None and bucket.index == len(self.buckets) - 1:
                    pieces.append(flags)
                    size = scratch.size + flags.size
                    if self._flags_scratch is None or self._flags_scratch.size != size:  # made once, not per step
                        self._flags_scratch = np.empty(size, scratch.dtype)
                    scratch = self._flags_scratch
                return allreduce_pieces(pieces, scratch, "mean", comm=context, check_finite=check, in_place=True)
            with running_on(context):
                future = self.hook(self.state, self._grad_buckets[bucket.index])
            result = hook_result(future, bucket.flat)
        except MPI.Exception:
            raise
        except Exception as error:
            if isinstance(error, TrainingError) and ProblemKind.HOOK_FAILED.summary in str(error):
                raise  # a peer's failure, reported to every rank already
            agree(context, "DistributedDataParallel", REPORT_FIELDS, InputProblem(
                ProblemKind.HOOK_FAILED, f"comm hook {hook_name(self.hook)} on bucket {bucket.index}: "
                                         f"{type(error).__name__}: {error}"))
            raise
        if result is not bucket.flat:
            bucket.flat.copy_(result)
        return True

    def agree_hook(self, hook: Hook, state: Any, problem: Optional[InputProblem] = None,
                   context: Optional[Context] = None, regrouped: bool = False) -> None:
        """Every rank's ``hook`` and state's kind the same, and no ``problem`` anywhere, else the
        same error on every rank; after a regroup, rank 0's hook state everywhere (collective)."""
        with watchdog.guard(f"the agreement on the comm hook {hook_name(hook)} before step {self.steps}"):
            context = context or self.context()
            agree_on_hook(context, hook, state, problem)
            if regrouped:
                sync_hook_state(context, state)

    def context(self) -> Context:
        """The library's context over its duplicate of the context's communicator (made again
        after a recovery), with a traffic count of its own."""
        outer = resolve(self.comm_arg)
        if self._source is not outer.comm:
            with watchdog.guard("duplicating the communicator of DistributedDataParallel's reductions"):
                comm = outer.comm.Dup()
            self._regrouped = True
            comm.Set_errhandler(MPI.ERRORS_RETURN)
            self._context = Context(comm, ft=outer.ft, cuda_aware=outer.cuda_aware, launcher=outer.launcher)
            self._source = outer.comm
        assert self._context is not None
        return self._context

    def revoke(self) -> None:
        """Revoke the library's communicator, if a reduction made it yet."""
        if self._context is not None:
            revoke(self._context.comm)

    def _finish(self) -> None:
        """End of backward: hand over the rest (missing gradients as zeros), wait, learn which
        parameters any rank used, check."""
        arrived, self._arrived = self._arrived, []
        try:
            for param in arrived:
                self._arrive(param)
        except BaseException:
            self.abandon()
            raise
        self.running = False
        if not self.syncing:
            return
        unused = []
        for bucket in self.buckets[self._next:]:
            for position, (param, view) in enumerate(zip(bucket.params, bucket.views)):
                if id(param) in self._fired or (bucket.index, position) in self.problems:
                    continue
                if id(param) not in self.fresh:  # not accumulated inside no_sync either
                    view.zero_()
                    unused.append(param)
            bucket.waiting = 0
        context, shards = self.context(), self.shards
        sent = context.traffic.sent
        try:
            self._flags = self._used_flags(unused) if self._carries_flags() else None
            self._hand_over_ready(final=True)
            with watchdog.guard(f"the gradient reduction of step {self.steps}"):
                self.thread.wait()
                local_bad = [] if shards is None else [param for bucket, ok in zip(self.buckets, self._finite)
                                                      if not ok for param in shards.nonfinite(bucket)]
                if self._flags is not None:  # reduced with the last bucket
                    used, bad_ids = {id(p) for p in unused if self._flags[self._order[id(p)]] > 0}, set()
                else:
                    used, bad_ids = self._used_anywhere(context, unused, local_bad if shards is not None else None)
        finally:
            self._flags = None
            problems, self.problems = self.problems, {}
            self.fresh.clear()
            self.steps += 1
            self._forget_sources()
        self.sent_last_step = context.traffic.sent - sent
        resolve(self.comm_arg).traffic.add(self.sent_last_step, self.sent_last_step)
        if shards is not None:
            bad = [name for bucket in self.buckets for param, name in zip(bucket.params, bucket.names)
                   if id(param) in bad_ids]
            shards.release(set(self.where) - {id(p) for p in unused if id(p) not in used})
        else:
            for param in unused:
                if id(param) in used:
                    bucket, position = self.where[id(param)]
                    param.grad = bucket.views[position]
            bad = [name for bucket, ok in zip(self.buckets, self._finite) if not ok for name in nonfinite(bucket)]
        if bad or problems:
            raise TrainingError(self._verdict(bad, problems))

    def _forget_sources(self) -> None:
        """Gradients reduced in autograd's own tensors stay there (as ``.grad``): forget them."""
        for bucket in self.buckets:
            bucket.sources = [None] * len(bucket.params)

    def _used_flags(self, unused: List[torch.nn.Parameter]) -> np.ndarray:
        """1 for each parameter (in ``where``'s order) but ``unused`` (0), in the last bucket's
        dtype: their mean over the ranks is above 0 where some rank used the parameter."""
        if self._flags_kept is None:
            self._flags_kept = np.empty(len(self._order), self.buckets[-1].flat.numpy().dtype)
        flags = self._flags_kept
        flags.fill(1)
        for param in unused:
            flags[self._order[id(param)]] = 0
        return flags

    def _used_anywhere(self, context: Context, unused: List[torch.nn.Parameter],
                       bad: Optional[List[torch.nn.Parameter]]) -> Tuple[Set[int], Set[int]]:
        """The ids of ``unused`` (this rank's parameters without a gradient) that some rank used,
        and (ZeRO-2, ``bad`` given: this rank's parameters with a NaN or Inf in its chunk) the ids
        some rank found not finite: one allreduce (MAX) of a flag or two per parameter, also where
        a failed hook is reported."""
        count, order = len(self.where), self._order
        flags = torch.ones(count if bad is None else 2 * count, dtype=torch.int32)
        for param in unused:
            flags[order[id(param)]] = 0
        if bad is not None:
            flags[count:] = 0
            for param in bad:
                flags[count + order[id(param)]] = 1
        with running_on(context):
            all_reduce(flags, "max")
        return ({id(param) for param in unused if flags[order[id(param)]]},
                {key for key, i in order.items() if bad is not None and flags[count + i]})

    def _verdict(self, bad: List[str], problems: Dict[Tuple[int, int], str]) -> str:
        mine = "; ".join(f"{self.buckets[index].names[position]}: {why}" for (index, position), why in problems.items())
        return (f"DistributedDataParallel, step {self.steps - 1}: the reduced gradient of "
                f"{', '.join(bad) or 'nothing'} "
                f"holds NaN or Inf (a rank's gradient did, or could not be reduced"
                f"{': on this rank, ' + mine if mine else ''}); the optimizer must not step on it. "
                f"Under loss scaling, which expects this, pass check_finite=False")

