"""``DistributedDataParallel``: torch DDP's interface over MPI ranks, reductions overlapping backward.

    model = hpcreduce.torch.DistributedDataParallel(model)     # rank 0's weights everywhere
    for x, y in shard:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()                       # gradients averaged when it returns
        optimizer.step()

Construction (collective): every rank's parameters must bucket the same way (names, shapes,
dtypes, bucket size, compression), else every rank raises ``InputMismatchError`` naming the
first difference; then rank 0's parameters and buffers are broadcast. A rank spawned into a
running elastic job (``context.joined``) skips both: the job's ``elastic.State`` sync gives
it the values, and a collective of its own would wait for ranks that are not in it. Every
argument is checked into that same cross-rank check: a bad one on one rank raises on all.
How a bucket is reduced is its comm hook's (``register_comm_hook``, torch's signature;
``hooks``): the mean through ``hpcreduce.collectives`` by default.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from numbers import Real
from typing import Any, Iterator, List, Optional, Tuple

import torch

from ..collectives.broadcast import broadcast_tensor
from ..collectives.validate import InputProblem, ProblemKind, agree, raise_local, stable_hash
from ..runtime.context import resolve
from .buckets import build, layout
from .dtypes import REDUCIBLE
from .parameters import broadcast_parameters
from .hooks.default import bf16_compress_hook, fp16_compress_hook
from .reducer import Hook, Reducer

DEFAULT_BUCKET_CAP_MB = 25.0
MAX_BUCKET_CAP_MB = float(2 ** 20)
"""The largest ``bucket_cap_mb`` taken (1 TiB)."""
COMPRESSIONS = {"bf16": bf16_compress_hook, "fp16": fp16_compress_hook}


class DistributedDataParallel(torch.nn.Module):
    """Wrap ``module`` for data-parallel training over the ranks of ``comm`` (default: the
    default context, whose communicator a recovery swaps underneath).

    ``bucket_cap_mb``: the most bytes of gradients per bucket; ``compression``: None, "bf16"
    or "fp16" (``bf16_compress_hook``/``fp16_compress_hook``: float32 gradients travel as 16
    bits, sums in float32; bfloat16 and float16 gradients always do); ``check_finite``: raise ``TrainingError`` on every rank when a
    reduced gradient holds a NaN or an Inf (one summing pass per bucket; pass False under
    loss scaling); ``overlap``: reduce on a thread while backward goes on (needs
    ``MPI_THREAD_MULTIPLE``; else, or False, at the end of backward; None: on a thread for
    GPU buckets, or when the rank has a core more than torch's threads); ``broadcast_buffers``:
    rank 0's buffers before every forward, as DDP does."""

    def __init__(self, module: torch.nn.Module, *, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB, comm=None,
                 compression: Optional[str] = None, check_finite: bool = True, overlap: Optional[bool] = None,
                 broadcast_buffers: bool = True):
        super().__init__()
        self.module = module
        context = resolve(comm)
        is_module = isinstance(module, torch.nn.Module)
        named = [(name, param) for name, param in module.named_parameters() if param.requires_grad] \
            if is_module else []
        cap, problem = _problem(module if is_module else torch.nn.Module(), named, bucket_cap_mb, compression,
                                {"check_finite": check_finite, "broadcast_buffers": broadcast_buffers},
                                overlap)
        buckets = layout(named, cap)
        settings = [cap, compression, check_finite, broadcast_buffers]
        if context.joined:
            raise_local("DistributedDataParallel", problem, context.rank)
        else:
            agree(context, "DistributedDataParallel",
                  [("buckets", stable_hash(buckets), lambda: buckets),
                   ("bucket_cap_mb, compression, check_finite, broadcast_buffers", stable_hash(repr(settings)),
                    lambda: settings)],
                  problem)
            broadcast_parameters(module, comm=context)
        self.comm = comm
        self.broadcast_buffers = broadcast_buffers and any(True for _ in module.buffers())
        self._named = named
        self._shapes = [param.shape for _, param in named]
        self.reducer = Reducer(build(named, cap), comm=comm, check_finite=check_finite, overlap=overlap)
        self._hook_from = f"compression={compression!r}" if compression else None
        if compression:
            self.reducer.hook = COMPRESSIONS[compression]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._check_parameters()
        if self.broadcast_buffers and self.reducer.syncing:
            context = resolve(self.comm)
            for buffer in self.module.buffers():
                with torch.no_grad():
                    broadcast_tensor(context, buffer, 0)
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside accumulate gradients in place without reducing them; the first
        backward after it reduces what accumulated."""
        before, self.reducer.syncing = self.reducer.syncing, False
        try:
            yield
        finally:
            self.reducer.syncing = before

    def register_comm_hook(self, state: object, hook: Hook) -> None:
        """Reduce every bucket with ``hook(state, bucket)`` from the next backward on (torch's
        signature: ``hooks.GradBucket`` in, a ``torch.futures.Future`` of the reduced flat
        tensor out; ``hooks`` has torch's built-ins). Collective: every rank registers the same
        hook (by qualified name) and kind of state, else every rank raises. Once per wrapper."""
        context = resolve(self.comm)
        name = f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', type(hook).__name__)}"
        reasons = []
        if not callable(hook):
            reasons.append(f"hook is a {type(hook).__name__}, not a function hook(state, bucket)")
        if self._hook_from is not None:
            reasons.append(f"a comm hook is registered already ({self._hook_from}); torch allows one")
        if self.reducer.running:
            reasons.append("it was called during backward")
        if self.reducer.shards is not None:
            reasons.append("a ZeroRedundancyOptimizer reduce-scatters this wrapper's gradients (ZeRO-2); "
                           "register the hook before making it")
        problem = InputProblem(ProblemKind.UNUSABLE_ARRAY, "; ".join(reasons)) if reasons else None
        kind = type(state).__qualname__
        fields = [("comm hook", stable_hash(name), name), ("hook state", stable_hash(kind), kind)]
        if context.joined:
            raise_local("DistributedDataParallel.register_comm_hook", problem, context.rank)
        else:
            agree(context, "DistributedDataParallel.register_comm_hook", fields, problem)
        self.reducer.hook, self.reducer.state, self._hook_from = hook, state, f"register_comm_hook({name})"

    def wire_bytes(self) -> int:
        """Bytes this rank sent in the last synchronised step (all buckets, through the hook;
        0 before the first)."""
        return self.reducer.sent_last_step

    def _check_parameters(self) -> None:
        """A parameter replaced or reshaped since wrapping goes to the reduction as NaN (every rank stops)."""
        current = [param for param in self.module.parameters() if param.requires_grad]
        pairs = zip(current, self._named, self._shapes)
        if len(current) == len(self._named) and all(now is then and now.shape == shape
                                                    for now, (_, then), shape in pairs):
            return
        for (name, then), shape in zip(self._named, self._shapes):
            owner, _, leaf = name.rpartition(".")
            now = getattr(self.module.get_submodule(owner) if owner else self.module, leaf, None)
            if now is not then or now.shape != shape:
                self.reducer.note_problem(name, "it was replaced or changed shape after wrapping "
                                                "(wrap the module after its last change)")

def _problem(module: torch.nn.Module, named: List[Tuple[str, torch.nn.Parameter]], bucket_cap_mb: object,
             compression: Optional[str], flags: dict, overlap: object) -> Tuple[int, Optional[InputProblem]]:
    """The bucket cap in bytes (the default's where the one given is unusable) and what this
    rank cannot wrap: a dtype, a sparse-gradient layer, an argument."""
    reasons = [f"parameter {name!r} is {param.dtype} (reducible: {', '.join(map(str, REDUCIBLE))})"
               for name, param in named if param.dtype not in REDUCIBLE]
    reasons += [f"module {name!r} makes sparse gradients (sparse=True; use a dense one, or the parameter "
                f"server's rows)" for name, sub in module.named_modules() if getattr(sub, "sparse", False) is True]
    if not (compression is None or isinstance(compression, str) and compression in COMPRESSIONS):
        reasons.append(f"compression {compression!r} is not one of None, {', '.join(map(repr, COMPRESSIONS))}")
    usable = isinstance(bucket_cap_mb, Real) and not isinstance(bucket_cap_mb, bool) \
        and math.isfinite(bucket_cap_mb) and 0 < bucket_cap_mb <= MAX_BUCKET_CAP_MB
    if not usable:
        reasons.append(f"bucket_cap_mb must be a number above 0 and at most {MAX_BUCKET_CAP_MB:g}, "
                       f"got {bucket_cap_mb!r}")
    cap = int(bucket_cap_mb * 2 ** 20) if usable else int(DEFAULT_BUCKET_CAP_MB * 2 ** 20)
    reasons += [f"{flag} must be True or False, got {value!r}" for flag, value in flags.items()
                if not isinstance(value, bool)]
    if overlap is not None and not isinstance(overlap, bool):
        reasons.append(f"overlap must be None, True or False, got {overlap!r}")
    if not named:
        reasons.append("the module has no parameter that takes a gradient (or is not a torch.nn.Module)")
    return max(cap, 1), InputProblem(ProblemKind.UNUSABLE_ARRAY, "; ".join(reasons)) if reasons else None
